"""`vllm bench serve`, run from vLLM's interpreter: vLLM's own argument parser and
`vllm.benchmarks.serve.main` (vLLM 0.32.0), the code the `vllm bench serve` subcommand runs
(its console script dies on a version lookup in the CPU build, bench/perf_vs_vllm_serve.py).
Nothing of qeval's measures here: this is the field's load generator, given a dataset qeval wrote.

    python -m qeval.backends.vllm.bench_serve ARGS...           one run
    python -m qeval.backends.vllm.bench_serve --serve-stdin FD  one run per JSON line (an argument list) on
                                                       stdin, "ok" or "error: ..." written to FD
                                                       after each: vLLM is imported once (a minute
                                                       on a loaded 2-core CPU), not once per level
"""

from __future__ import annotations

import json
import os
import sys


def _parser() -> object:
    import vllm.benchmarks.serve as bench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    bench.add_cli_args(parser)
    return parser


def main(argv: list[str]) -> None:
    """Parse `argv` as `vllm bench serve` does and run it; with --serve-stdin FD, serve runs."""
    import vllm.benchmarks.serve as bench

    parser = _parser()
    if argv[:1] != ["--serve-stdin"]:
        bench.main(parser.parse_args(argv))  # type: ignore[attr-defined]
        return
    with os.fdopen(int(argv[1]), "w") as status:
        status.write("ready\n")
        status.flush()
        for line in sys.stdin:
            try:
                bench.main(parser.parse_args(json.loads(line)))  # type: ignore[attr-defined]
                status.write("ok\n")
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported to the parent, which raises
                status.write(f"error: {type(exc).__name__}: {str(exc).strip()[:300]}".replace("\n", " ") + "\n")
            status.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
