"""env-ab, one installed namespace: the shared helpers live here (the typed pre-registration,
schema checks, hashing, atomic writes, receipts), and the stages install beneath it from their
own top-level folders: `envab.envs` (envs/), `envab.trainer` (trainer/), `envab.eval` (eval/),
`envab.analysis` (analysis/). A stage imports only from the ones before it in that order.

Two jobs of `analysis/` play episodes: the confirmatory evaluation (`analysis/confirm.py`) and the
stop-at-target judge (`analysis/stop_at_target.py`). They play through `eval/` but decide by the
analysis' own rules (the crossing rule, the confirmation's exact test), and a module of `eval/`
may not import those, so they live with the rules that decide.

Every stage imports these helpers rather than keeping its own copy, so a digest means the same
thing in the freeze stage, the trainer and `verify`.
"""
