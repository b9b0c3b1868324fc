#!/usr/bin/env python3
"""Which RoPE base lets a model tell a matching key from a random one at every distance of its context.

Men et al., "Base of RoPE Bounds Context Length" (2024): with RoPE, the expected attention score of a
query on a key that equals it, minus that on a random key, is proportional to
    B(m) = sum_i cos(m * theta_i),   theta_i = base ** (-2 i / head_dim),  i = 0 .. head_dim / 2 - 1,
at relative distance m. Where B(m) < 0 the model cannot, on average, prefer the matching token at that
distance, which is what in-context recall (an induction head finding the earlier copy of the current
token) needs. The paper derives the smallest base keeping B(m) >= 0 for every m up to the context.

This prints, per head_dim and base, the first distance where B(m) turns negative (none: it holds over the
whole context) and the minimum of B over the context. Standard library only.

    python3 tools/train/rope_base_bound.py --context 2048 --head-dims 32,64
"""
import argparse
import math


def discrimination(base, head_dim, distance):
    """B(m) of the docstring above."""
    return sum(math.cos(distance * base ** (-2.0 * i / head_dim)) for i in range(head_dim // 2))


def first_negative(base, head_dim, context):
    """(first distance in 1..context where B < 0 or None, min of B over 1..context)."""
    first, lowest = None, math.inf
    for m in range(1, context + 1):
        b = discrimination(base, head_dim, m)
        lowest = min(lowest, b)
        if b < 0 and first is None:
            first = m
    return first, lowest


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--head-dims", default="32,64")
    p.add_argument("--bases", default="10000,40000,100000,500000,1000000")
    args = p.parse_args()
    print("head_dim  base       first distance with B < 0   min B over the context")
    for head_dim in (int(x) for x in args.head_dims.split(",")):
        for base in (float(x) for x in args.bases.split(",")):
            first, lowest = first_negative(base, head_dim, args.context)
            print(f"{head_dim:8d}  {base:<9.0f}  {str(first) if first else 'none':>26}   {lowest:8.2f}")


if __name__ == "__main__":
    main()
