"""Answering a batch of request bodies with a model and a codec: decode each, run the good ones
as one batch, encode each. Shared by the pool's instance processes, the in-process (stock)
handler and the profiler's served points, so all three answer alike. A request's own failure is
answered alone: 4xx for bad input, 500 for ours (encoding, or the model failing on that input);
its batch-mates are not touched.

The batch's inputs live in ``InputRows`` (rows.py): one preallocated tensor per model input, a
row per request. Each request is decoded into its row (an image's pixels normalised straight into it; a
raw tensor body that already lies in its row, where the pool's parent wrote it, is not copied at
all), and the model reads the first rows as they are: nothing is allocated, concatenated or
copied per request between the request's bytes and the runtime. Without rows (or for a request
carrying several samples) the samples are concatenated, as before rows existed.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch

from packrat.codec.codec import Codec
from packrat.codec.answers import TOP_FORMS
from packrat.codec.config import Decoded
from packrat.codec.rows import InputRows
from packrat.codec.samples import NOT_FINITE, all_finite
from packrat.errors import RequestError, error_body, first_line
from packrat.models.runtimes import RunCancelled


class Reply(NamedTuple):
    """One request's answer; pool.Answer(*reply) wraps it. A tuple, so it crosses from an instance
    process to the parent as plain pickled data."""
    status: int
    body: bytes  # JSON, or a binary KServe v2 answer
    reason: str = ""  # one line ("" when 200)
    content_type: str = "application/json"
    header_length: int | None = None  # binary KServe v2 answers: Inference-Header-Content-Length


# ---- decoding side by side ---------------------------------------------------------------------

def set_intra_op_threads(threads: int) -> None:
    """This thread's torch intra-op threads, fixed now. torch reads its process-wide count into a
    thread's own OpenMP setting on that thread's first parallel region, so a thread that has not
    run one yet would take whatever count another thread set last: asking for the count runs that
    first read here, with ours."""
    torch.set_num_threads(threads)
    torch.get_num_threads()


_PROCESS_COUNT = threading.Lock()  # one own_intra_op_threads at a time puts the process's count back


def own_intra_op_threads(threads: int) -> None:
    """This thread's torch intra-op threads fixed at `threads`, the process's count left as it was:
    torch.set_num_threads sets both this thread's OpenMP count and the count every thread reads on
    its first parallel region, so the latter is read and put back from threads of their own."""
    with _PROCESS_COUNT:
        process = _on_a_new_thread(torch.get_num_threads)  # a fresh thread reads the process's count
        set_intra_op_threads(threads)
        _on_a_new_thread(lambda: torch.set_num_threads(process))


def _on_a_new_thread(call):
    """call() on a thread started for it, and its result."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call()), name="packrat-torch-count")
    thread.start()
    thread.join()
    return result[0]


class Decoders:
    """Decodes a batch's requests in parallel on the instance's cores. JPEG decoding and resizing
    release the GIL (issue 25, 4 ResNet-50 photos: 18.0 ms on 2 decoders against 23.0
    in turn, BENCHMARKS.md); tokenising holds it, so only image models get decoders. A lone
    request is decoded on the calling thread: a hop to a decoder would only add to it. Each decoder runs one intra-op thread: its tensor
    work must not lead an OpenMP team of its own, since a second team in the process makes every
    team sleep between parallel regions instead of spinning (BENCHMARKS.md, IOS: 1.3x slower
    models). `process_wide`: each sets its count as the process's too (set_intra_op_threads: an
    instance process's decoders, which start before the model's count is set for good); else its
    own alone (own_intra_op_threads: a thread instance's, in a process whose count is its host's)."""

    def __init__(self, threads: int, process_wide: bool = True):
        self._pool = None
        if threads > 1:
            started = threading.Barrier(threads)
            self._pool = ThreadPoolExecutor(threads, "packrat-decode", initargs=(1,), initializer=set_intra_op_threads
                                            if process_wide else own_intra_op_threads)
            list(self._pool.map(lambda _: started.wait(), range(threads)))  # every thread up, not one reused

    @property
    def parallel(self) -> bool:
        """Whether it decodes on threads of its own, beside the model's on the same cores."""
        return self._pool is not None

    def mapper(self, requests: int):
        """map() for a batch of `requests`: the decoders' when there is more than one to decode."""
        return self._pool.map if self._pool is not None and requests > 1 else map


# ---- a batch ---------------------------------------------------------------------------------------

def answer_batch(module, codec: Codec, bodies: list[tuple], mapper=map, laps: list[float] | None = None,
                 rows: InputRows | None = None, in_rows: frozenset[int] = frozenset()) -> list[Reply]:
    """A reply for each (body, content type[, KServe v2 header length]), in order.

    `mapper(fn, items)` decodes the bodies (map: one after another; the pool's instances pass a
    thread pool's map). With `rows`, each request is decoded into its row and the model reads the
    rows; `in_rows`: the indices whose bodies already lie in their row (raw tensors the pool's
    parent wrote there): they are decoded where they lie, on this thread, since there is nothing to
    do but check them. With `laps`, the time.monotonic() after decoding, after the model's run and
    after encoding are appended to it (the pool's stage timing)."""
    answers: list = [None] * len(bodies)
    decode = _decoder(codec, rows)
    outcomes: list = [None] * len(bodies)
    for index in in_rows:  # ready where it lies, or decoded there on this thread
        outcomes[index] = READY if codec.ready_in_row(*bodies[index]) else decode((index, bodies[index]))
    indices = [i for i in range(len(bodies)) if i not in in_rows]
    if indices:
        with codec.tokenized(bodies):  # a text model's texts tokenised in one call
            for index, outcome in zip(indices, mapper(decode, [(i, bodies[i]) for i in indices])):
                outcomes[index] = outcome
    decoded = {}
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, Reply):
            answers[index] = outcome
        else:
            decoded[index] = outcome
    _lap(laps)
    placed = rows is not None and all(placed for _, placed in decoded.values())
    if placed and decoded:
        outputs, whole = run_rows(module, rows, list(decoded))
    else:
        outputs, whole = run_each(module, {i: _samples(rows, i, d) for i, (d, _) in decoded.items()}), None
    _lap(laps)
    _encode_all(codec, rows, decoded, outputs, whole, answers)
    _lap(laps)
    return answers


def _encode_all(codec: Codec, rows: InputRows | None, decoded: dict, outputs: dict | None,
                whole: torch.Tensor | None, answers: list) -> None:
    """Each decoded request's answer into `answers`. What every row's answer needs is computed for
    the batch at once, and a row's own slice of `whole` only where its answer reads it: a call or a
    tensor per request costs more than the work in it (SqueezeNet, B = 8: encoding took 0.08 ms a
    request; an MLP's batch of 8 spent 0.06 ms slicing its outputs; docs/benchmarks/peers.md).

    An answer is "not finite" where what it reads is: a row answered with its top classes reads its
    top scores, which a NaN or +inf anywhere in the row makes NaN (its softmax is), while an -inf
    logit (a class masked) scores 0 and the answer stands; any other answer reads every output."""
    # a batch's top classes only where a row's answer is them (a v2 answer is the outputs themselves)
    read_tops = whole is not None and any(item.form in TOP_FORMS for item, _ in decoded.values())
    tops = codec.answers.tops(whole) if read_tops else None
    # Every output, where some answer reads them all: one pass for the batch after tops read it, rows
    # only if it fails. Not where every answer is top classes: a library's first call after the
    # model's run is cold, 45-60 us a batch (SqueezeNet, B = 4 and 8).
    every_top = tops is not None and all(item.form in TOP_FORMS for item, _ in decoded.values())
    finite = whole is not None and not every_top and all_finite(whole)
    top_json = codec.answers.top_json
    for position, (index, (item, _)) in enumerate(decoded.items()):
        output = outputs[index] if whole is None else None
        if isinstance(output, str):
            answers[index] = error(500, output)
            continue
        top = None  # its answer reads its outputs unless it is its top classes
        if item.form in TOP_FORMS:
            top = tops[position] if tops is not None else _top(codec, output)
        if top is not None:
            answers[index] = _top_answer(top, item.form == "kserve-v1", top_json, lambda: _samples(rows, index, item))
            continue
        output = whole[position:position + 1] if output is None else output
        if not finite and not all_finite(output):
            answers[index] = not_finite(_samples(rows, index, item))
            continue
        try:
            encoded = codec.encoded(output, item)
            answers[index] = Reply(200, encoded.body, "", encoded.content_type, encoded.header_length)
        except Exception as exc:  # our failure, this request's alone
            answers[index] = _encode_failure(exc)


def _top_answer(top: tuple[list[float], list[int]], kserve_v1: bool, top_json, samples) -> Reply:
    """A row's answer of its top classes, or "not finite" where its top scores are not (`samples()`:
    its inputs, which say whose it is)."""
    if not math.isfinite(sum(top[0])):
        return not_finite(samples())
    try:
        return Reply(200, top_json(top, kserve_v1))
    except Exception as exc:  # our failure, this request's alone
        return _encode_failure(exc)


def _top(codec: Codec, output) -> tuple[list[float], list[int]] | None:
    """A request's own top classes, when it ran alone (run_each) with one sample; else None."""
    if output is None or len(output) != 1:
        return None
    tops = codec.answers.tops(output)
    return tops[0] if tops else None


def not_finite(samples: tuple[torch.Tensor, ...]) -> Reply:
    """The answer to a request whose outputs hold NaN or infinity: 400 when its inputs do (the
    model only passed them on), else 500. Inputs are checked here rather than as they are decoded:
    a pass over every input was a cost every request paid (SqueezeNet at B = 8 through the pool:
    1.5-2 ms of a 25 ms batch, reading rows the runtime reads again; BENCHMARKS.md, issue 41), and
    an input that is not finite almost always makes the output so; where the model absorbs it,
    its finite answer stands."""
    if any(sample.is_floating_point() and not all_finite(sample) for sample in samples):
        return error(400, NOT_FINITE)
    return error(500, "the model's outputs for this input are not finite (NaN or infinity)")


def _decoder(codec: Codec, rows: InputRows | None):
    """One request's decode, as (Decoded, whether it now lies in its row), or its RequestError as
    its error reply (a mapper must not raise: one request's failure would cost the batch)."""
    def decode(item: tuple):
        index, request = item
        try:
            decoded = codec.decode(*request, into=rows.row(index) if rows is not None and index < rows.slots else None)
        except RequestError as exc:
            return error(exc.status, exc.reason)
        return decoded, rows is not None and rows.put(index, decoded.samples)
    return decode


# A raw tensor body that lies in its row as it came (Codec.ready_in_row): its samples are the row
# (_samples), made only where they are read (a batch run request by request, a NaN answered), not
# for every request; decode() would make and check tensors per sample
IN_ROW = Decoded((), "plain")
READY = (IN_ROW, True)  # its outcome: decoded, in its row


def _samples(rows: InputRows | None, index: int, decoded: Decoded) -> tuple[torch.Tensor, ...]:
    """A decoded request's samples: those of a body lying in its row are that row, as views."""
    if decoded is IN_ROW:
        return tuple(tensor[index:index + 1] for tensor in rows.tensors)
    return decoded.samples


def _lap(laps: list[float] | None) -> None:
    if laps is not None:
        laps.append(time.monotonic())


def run_rows(module, rows: InputRows, indices: list[int]) -> tuple[dict | None, torch.Tensor | None]:
    """(None, the outputs of one call on the rows, a row per request in the order of `indices`);
    if that call fails, (each index's outputs from run_each: each request alone, None)."""
    inputs = rows.taken(indices)
    with torch.inference_mode():
        try:
            return None, module(*inputs)
        except RunCancelled:  # the watchdog's: the batch runs again elsewhere, not request by request here
            raise
        except Exception:
            if len(indices) == 1:
                return run_each(module, {indices[0]: tuple(tensor[:1] for tensor in inputs)}), None
    return run_each(module, {index: tuple(tensor[position:position + 1] for tensor in inputs)
                             for position, index in enumerate(indices)}), None


def run_each(module, samples: dict) -> dict:
    """Each key's outputs from one batched call; if that call fails, each key alone, so only
    the inputs the model really fails on get the failure (a one-line reason instead of outputs).
    A key's samples are one tensor per model input, each (k, ...): the call concatenates them
    input by input and passes the inputs in order."""
    if not samples:
        return {}
    with torch.inference_mode():
        try:
            outputs = module(*batched(list(samples.values())))
            sizes = [len(s[0]) for s in samples.values()]
            return dict(zip(samples, torch.split(outputs, sizes)))
        except RunCancelled:
            raise
        except Exception as exc:
            if len(samples) == 1:
                return {next(iter(samples)): f"the model failed on this input: {type(exc).__name__}: {first_line(exc)}"}
    result = {}
    for key, value in samples.items():
        result.update(run_each(module, {key: value}))
    return result


def batched(samples: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    """Several requests' inputs as one batch: each input's samples concatenated (a lone request's
    taken as they are)."""
    if len(samples) == 1:
        return list(samples[0])
    return [torch.cat(parts) for parts in zip(*samples)]


def _encode_failure(exc: Exception) -> Reply:
    """A request whose answer could not be encoded: our failure, its alone."""
    return error(500, f"cannot encode the answer: {type(exc).__name__}: {first_line(exc)}")


def error(status: int, reason: str) -> Reply:
    return Reply(status, error_body(reason), reason)
