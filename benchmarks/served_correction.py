"""A plan picked on split figures 30 % too optimistic, corrected from what its instances serve
(packrat/bench/correction.py).

    .venv/bin/python benchmarks/served_correction.py --profile profiles/squeezenet.csv --model squeezenet
                                                     [--batch 4] [--seconds 150] [--skew 0.7] [--point T,B]
                                                     [--json OUT]"""

from __future__ import annotations

import sys
from pathlib import Path

from packrat.bench.harness import doc_parser
from packrat.bench.correction import correction_run
from packrat.bench.results import write_json
from packrat.cli.types import int_list


def build_parser():
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="squeezenet")
    parser.add_argument("--profile", type=Path, required=True, help="the model's (true) profile")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--skew", type=float, default=0.7, help="factor on the split points' figures")
    parser.add_argument("--point", type=int_list, default=None, metavar="T,B",
                        help="skew this ⟨threads, batch⟩ alone, under every runtime (default: every split point)")
    parser.add_argument("--served-dir", type=Path, default=None, metavar="DIR",
                        help="keep the engine's served-latency file here (default: a temporary folder): a later "
                             "run starts from its corrections, and packrat bench peers --served-corrections plans on them")
    parser.add_argument("--json", type=Path, default=None)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    result = correction_run(args.model, args.profile, args.batch, args.seconds, args.skew,
                            progress=lambda s: print(f"\r{s:5.0f} s", end="", file=sys.stderr, flush=True),
                            point=tuple(args.point) if args.point else None, served_dir=args.served_dir)
    print(file=sys.stderr)
    print(f"skewed profile's plan: {result['first_plan']}; the true profile's: {result['plan_from_the_true_profile']}")
    for switch in result["switches"]:
        print(f"switched to {switch['plan']} after {switch['after_s']:.1f} s (took {switch['seconds']:.1f} s, "
              f"{switch['failed_requests']} failed): {switch['reason']}")
    for trial in result["served"]["trials"]["history"]:
        print(f"trial of {trial['plan']} instead of {trial['previous']}: {trial['seconds']:.0f} s, {trial['outcome']}")
    print(f"final plan: {result['final_plan']}, served since {result['final_plan_since_s']:.0f} s; "
          f"requests sent {result['sent']}, failed {result['failed']}")
    for i in result["served"]["instances"]:
        print(f"  ⟨{i['threads']}, {i['batch']}, {i['runtime']}⟩ predicted {i['predicted_ms']} ms, planned with "
              f"{i['planned_ms']}, served {i['served_ms']} ({i['samples']} batches)")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
