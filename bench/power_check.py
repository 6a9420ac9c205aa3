"""Sizing from a pilot, against the closed form (analysis/power.py; issue 36 item 6).

    python bench/power_check.py

A pilot of log-normal times (baseline median 600 s, log SD 0.2; per-seed log time ratio SD 0.4),
a 1.5x speed-up to detect at alpha 0.05 with power 0.8: seeds per arm by the paired t-test's
closed form at the SD's estimate and at its 80 % interval's ends (3 and 5 pilot pairs), and by
the registered analysis simulated with the budget censoring it (4,000 studies per seed count),
with the power and the t interval's coverage at 5 seeds per arm.
"""

from __future__ import annotations

import math

from envab.analysis.power import Pilot, size


def main() -> None:
    print("| pilot pairs | budget s | closed form (SD low / estimate / high) | simulated "
          "| at 5 seeds: power, coverage, censored |")  # fmt: skip
    print("|---|---|---|---|---|")
    for pairs in (3, 5):
        for budget in (1e9, 650.0, 450.0):
            pilot = Pilot(pairs, math.log(600.0), 0.2, 0.4, pairs, budget)
            s = size(pilot, 1.5, draws=4000, registered_seeds=5)
            f, r = s["closed_form"], s["at_registered_seeds"]
            shown = "none" if budget > 1e8 else f"{budget:g}"
            form = f"{f['seeds_at_lower_sd']} / {f['seeds_at_estimate']} / {f['seeds_at_upper_sd']}"
            at5 = f"{r['power']:.3f}, {r['coverage_95']:.3f}, {r['censored_share']:.2f}"
            print(f"| {pairs} | {shown} | {form} | {s['simulated']['seeds_needed']} | {at5} |")


if __name__ == "__main__":
    main()
