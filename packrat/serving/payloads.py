"""Which figures the plan is made on, from the bodies the model is served. Pure: counts in, a
basis ("served" or "model", profiles.BASES) out.

A profile's served figures time sub-batches answered from one payload (its `payload`: jpeg, text
or raw), its model-only figures the model alone. A raw tensor body of one sample is written
straight into its row of the batch (codec.rows), so what it costs is the model's figure and a copy;
any other body (an image, text, JSON, KServe v2) is decoded in the instance first. A plan made on
JPEG figures for clients that send tensors overrates the decode: on 2 cores a SqueezeNet plan made
on JPEG figures served raw tensors at 0.62–0.73 of one ONNX Runtime session, against 0.72–0.99 for a
plan made on raw figures (issue 48). So the engine counts, per look, the bodies that went straight
into their rows against those decoded, and plans on:
- the served figures when most bodies are of the kind they were measured from (decoded bodies for a
  jpeg or text profile, raw ones for a raw profile);
- the model-only figures when most bodies are raw tensors and the profile's served figures decode;
- the served figures of a raw profile when bodies must be decoded: no figure times that decode,
  and the served one is the nearer.
A change needs SHARE_TO_SWITCH of the bodies judged, at least MIN_BODIES of them (added up over
looks where one look sees fewer), so a few stray requests of the other kind do not move the plan.
Counting costs the pool's submit one comparison of the body's size with a row's.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_BODIES = 16  # bodies judged at once: fewer wait for the next look
SHARE_TO_SWITCH = 0.75  # the share of the other kind of body that changes the basis


def planned_for(profile, raw_share: float):
    """`profile` planning on the figures of bodies of which `raw_share` are raw tensors (basis_for):
    what the engine plans on once it has seen such bodies, and what a benchmark sending them plans on."""
    return profile.on(basis_for(profile.payload, raw_share))


@dataclass
class BodyCounts:
    """Bodies handed to the pool since the last look: raw (one sample's tensor as it lies: one_row)
    and decoded."""
    raw: int = 0
    decoded: int = 0

    def take(self) -> tuple[int, int]:
        """(raw, decoded) since the last take, and start counting afresh."""
        seen = (self.raw, self.decoded)
        self.raw = self.decoded = 0
        return seen


SMALL_HEADER = 4096  # a binary v2 header this long or shorter is parsed in microseconds


def one_row(body_bytes: int, header_length, row_bytes: int) -> bool:
    """Whether a body is one sample's tensor as it lies: raw bytes of one row, or a binary KServe v2
    body of a small JSON header (`header_length`, as sent) and one row's bytes, as tritonclient sends
    one sample; its decode parses the header and copies the bytes into the row, as cheap as a raw
    tensor's for the kind of instance that serves it (counted raw: instances stay threads)."""
    if body_bytes == row_bytes:
        return True
    try:
        length = int(header_length)
    except (TypeError, ValueError):
        return False
    return 0 < length <= SMALL_HEADER and body_bytes - length == row_bytes


def basis_for(payload: str | None, raw_share: float) -> str:
    """The basis for bodies of which `raw_share` are raw tensors, under a profile whose served
    figures were measured from `payload` (None: it has none, so only model figures exist)."""
    if payload is None:
        return "model"
    if payload == "raw":
        return "served"  # raw bodies: exactly what was measured; decoded ones: the nearest figure there is
    return "model" if raw_share >= 0.5 else "served"


@dataclass
class PayloadWatch:
    """The basis the engine plans on, following the bodies served. `payload`: the profile's served
    payload (None: model-only figures); `basis`: the one planned on now."""
    payload: str | None
    basis: str
    min_bodies: int = MIN_BODIES
    share: float = SHARE_TO_SWITCH
    decoding: bool = False  # most bodies judged last were decoded (not raw tensors): a clear majority moves it
    pending: tuple[int, int] = (0, 0)  # (raw, decoded) not yet judged: fewer than min_bodies
    judged: tuple[int, int] = (0, 0)  # the last mix judged, for status

    def look(self, raw: int, decoded: int) -> str | None:
        """Bodies served since the last look: the new basis when the mix calls for another one, else
        None. Bodies add up across looks until there are min_bodies to judge (a slow model's look
        may see few)."""
        raw, decoded = raw + self.pending[0], decoded + self.pending[1]
        if raw + decoded < self.min_bodies:
            self.pending = (raw, decoded)
            return None
        self.pending, self.judged = (0, 0), (raw, decoded)
        raw_share = raw / (raw + decoded)
        if raw_share >= self.share:  # a clear majority either way; in between, the basis stays
            wanted, self.decoding = basis_for(self.payload, 1.0), False
        elif raw_share <= 1 - self.share:
            wanted, self.decoding = basis_for(self.payload, 0.0), True
        else:
            return None
        if wanted == self.basis:
            return None
        self.basis = wanted
        return wanted

    def status(self) -> dict:
        raw, decoded = self.judged
        what = ("the model's own figures (raw tensors skip the decode)" if self.basis == "model"
                else f"figures served from {self.payload} bodies")
        return {"planned_on": self.basis, "profile_payload": self.payload,
                "bodies_last_judged": {"raw": raw, "decoded": decoded},
                "says": f"planned on {what}; last bodies judged: {raw} raw, {decoded} decoded"}
