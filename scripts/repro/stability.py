"""The verdict-stability rule of the claims table (issue 44): a verdict must not depend on the
bootstrap's random draws.

The documents' part of an interval comes from a bootstrap, whose Monte Carlo error (about 3 % of the
variance at 2,000 resamples) moves a bound by a percent or two of its half-width. A verdict whose
bound lies that close to its boundary is decided by the draws (the audit found one read "confirmed"
for 68 % of bootstrap seeds and "inconclusive" for the rest). So each claim is computed with SEEDS
bootstrap seeds:
- all give the verdict of seed 0: it stands, at the given resamples;
- otherwise the claim is computed again with MORE times the resamples (the Monte Carlo error falls
  by its square root) and SEEDS seeds; if all agree, that verdict stands (its figures are those at
  the larger count); if not, the claim is "inconclusive" (borderline), with the share of seeds that
  gave each verdict.
"""

from collections import Counter

SEEDS = 20
MORE = 10


def stable(measure, n: int, seed: int = 0) -> tuple[list, str, dict]:
    """measure(n, seed) -> (figures, verdict). Returns the figures and the verdict by the rule above,
    and the record of the check: resamples, seeds, how many seeds gave each verdict, and whether the
    verdict was called inconclusive because the seeds disagree."""
    for resamples in (n, n * MORE):
        figures, verdict = measure(resamples, seed)
        found = Counter([verdict] + [measure(resamples, seed + k)[1] for k in range(1, SEEDS)])
        if found[verdict] == SEEDS:
            return figures, verdict, {"resamples": resamples, "seeds": SEEDS, "verdicts": dict(found),
                                      "raised": resamples > n, "borderline": False}
    return figures, "inconclusive", {"resamples": resamples, "seeds": SEEDS, "verdicts": dict(found.most_common()),
                                     "raised": True, "borderline": True}


def stability_text(check: dict) -> str:
    """`borderline: confirmed for 14 of 20 bootstrap seeds, inconclusive for 6, at 20000 resamples`, or
    for a verdict that needed the larger count `the same for 20 of 20 bootstrap seeds at 20000
    resamples`; "" when it held at the first count."""
    if check["borderline"]:
        shares = ", ".join(f"{v} for {k}" + (f" of {check['seeds']} bootstrap seeds" if i == 0 else "")
                           for i, (v, k) in enumerate(check["verdicts"].items()))
        return f"borderline: {shares}, at {check['resamples']} resamples"
    if check["raised"]:
        return f"the same for {check['seeds']} of {check['seeds']} bootstrap seeds at {check['resamples']} resamples"
    return ""
