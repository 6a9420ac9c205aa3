"""env-ab, one installed namespace: the shared helpers live here (the typed pre-registration,
schema checks, hashing, atomic writes, receipts), and the stages install beneath it from their
own top-level folders: `envab.envs` (envs/), `envab.trainer` (trainer/), `envab.eval` (eval/),
`envab.analysis` (analysis/). A stage imports only from the ones before it in that order.

Every stage imports these helpers rather than keeping its own copy, so a digest means the same
thing in the freeze stage, the trainer and `verify`.
"""
