#!/usr/bin/env python3
"""What a seeded request costs the sampler, on CPU, at Gemma 4's vocabulary (262,144).

    /path/to/vllm-0.30.0/python scripts/bench_seeded_sampling.py VLLM_GAUDI_SRC [--reps N] [--threads N]

For batch sizes 1, 8 and 64, in one run and interleaved: vLLM 0.30.0's random_sample with no
seed (the baseline), the pack's _hpu_random_sample (seeded-sampling, from the checkout's
patches.py with the pack applied) with every row seeded and with one seeded row, and vLLM's
per-row torch.Generator draw (what the pack used to do on the host). Prints median times and
each one's ratio to the baseline; the target is seeded <= 1.10 x unseeded. Ratios, not times,
are the result: the machine's load moves times, not the comparison.
"""

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "tests"), REPO]
VOCAB = 262144


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", metavar="VLLM_GAUDI_SRC")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import gaudi_fixes_helpers as h
    import gaudi_runner as gr
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample

    patches = gr.load_patches_module(os.path.abspath(args.src), h.gaudi_fixes())

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocab {VOCAB}, median of {args.reps}")
    print(f"{'batch':>5}  {'unseeded':>10}  {'all seeded':>18}  {'1 seeded row':>18}  {'torch.Generator rows':>22}")
    for bs in (1, 8, 64):
        probs = torch.randn(bs, VOCAB, generator=torch.Generator().manual_seed(bs)).mul(3).softmax(-1)
        draws = [patches.SeededDraws(1000 + i) for i in range(bs)]
        cases = {
            "unseeded": lambda p: random_sample(p, {}),
            "all seeded": lambda p: patches._hpu_random_sample(p, dict(enumerate(draws))),
            "1 seeded row": lambda p: patches._hpu_random_sample(p, {0: draws[0]}),
            "torch.Generator rows": lambda p: random_sample(
                p, {i: torch.Generator().manual_seed(1000 + i) for i in range(bs)}
            ),
        }
        times = {name: [] for name in cases}
        for rep in range(args.reps + 1):
            for name, fn in cases.items():
                p = probs.clone()  # random_sample divides probs in place
                start = time.perf_counter()
                fn(p)
                if rep:  # the first round warms up
                    times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        base = med["unseeded"]
        cells = [f"{med[n]:7.1f} ms ({med[n] / base:4.2f}x)" for n in list(cases)[1:]]
        print(f"{bs:>5}  {base:7.1f} ms  " + "  ".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
