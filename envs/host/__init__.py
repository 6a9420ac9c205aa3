"""The embedded environment host: the Drums protocol over HTTP, one worker process per desktop.

Start it standalone with `python -m envab.envs.host --mode fork|restore --port P --token-file F`, or
from Python with `serve_embedded(mode, token_file)` (a free loopback port, for one job).
Linux only. Each environment runs in a gVisor sandbox (`--sandbox gvisor`, the default: create
restores a prepared checkpoint, fork is checkpoint + restore; `envab.envs.host.gvisor`) or as a
plain process forked from a zygote (`--sandbox process`: os.fork, channels passed as descriptors).
`--world xdesktop --rootfs DIR` serves the real X desktop instead of the Pillow one (gVisor only).

Protocol (JSON over HTTP, version 1). Every request carries `Authorization: Bearer <token>`;
any request without the right token, health included, gets 401. Screenshots are base64 PNG.

    GET    /v1/health                 -> {status, mode, can_fork, environments, zygote_pid,
                                              allow_faults}
    POST   /v1/envs                   {task | task_id, faults?}
                                      -> 201 {env_id, generation: 0, screenshot_png,
                                              state_sha256, task_sha256, valid, verdict,
                                              failed_gates, timings}
    POST   /v1/envs/{id}/fork         {n, faults?}
                                      -> {children: [{env_id, generation, state_sha256, valid,
                                              verdict, failed_gates}], timings}
    POST   /v1/envs/{id}/step         {action, generation}
                                      -> {env_id, generation, screenshot_png, state_sha256, done,
                                              valid, verdict, failed_gates, timings}
    GET    /v1/envs/{id}/screenshot   -> {env_id, generation, screenshot_png, state_sha256,
                                              valid, verdict, failed_gates}  (no action)
    POST   /v1/envs/{id}/verify       -> {score, valid, verdict, failed_gates, audit}
    DELETE /v1/envs/{id}              -> {env_id, closed}

Semantics:
- create takes the task whole, or by `task_id` from the tasks.jsonl the host was started with
  (`--tasks`); `task_sha256` is the digest of the task it set up (`envab.hashing.sha256_json`).
- create runs the task's set-up on the prepared blank desktop: in `restore` mode the worker
  restores it from a saved snapshot; in `fork` mode the worker is a copy of a running prepared
  desktop (a restored checkpoint in gVisor, a copy-on-write fork as a process). The state hash
  must equal `task.evaluator.initial_state_sha256` where the task names one (a task the project
  did not draw itself may not).
- fork (fork mode only; restore mode answers 501) makes n children in the parent's exact state:
  each child's state hash must equal the parent's. Children keep the parent's generation.
- step applies one computer_13 action chosen from screenshot `generation`; on success the
  generation goes up by one. `done` is true after DONE or FAIL. An action the desktop refuses
  (off screen, after DONE) gets 422 and changes nothing.
- verify reads the state back from the worker and runs the task's checker in the host process.
- A failed gate is not an HTTP error: the body says `valid: false`, the verdict and the failed
  gates (see `envab.envs.protocol`), and the environment is quarantined: its worker is stopped,
  every later step answers with the same verdict, verify says invalid, fork answers 409.
- Other errors: 400 malformed request, 403 faults without --allow-faults, 404 unknown id.

Fault injection (only with --allow-faults), in the create request's `faults` object, or per
child in a fork request's `faults` list (a child never inherits its parent's):
`kill_at_step`, `stall_at_step`, `blank_at_step`, `stale_at_step` (the screenshot from before the
action), `unknown_gate_at_step` (a gate no client knows, as a newer host would report),
`restart_host_at_step` (the host process dies mid-step, losing every environment; the embedded
host's supervisor starts it again on the same socket) — each at the environment's step count from
1, a fork child counting on from its parent's — and `corrupt_restore`, `verifier_unavailable`
(booleans).

Every step's screenshot carries the frame number its worker drew it at; a frame that is not the
step's fails gate `screen_current` (a display that stopped updating). A request for an
environment the host does not hold (it restarted since) gets 404, which a client reads as gate
`session_known`.
"""

__all__ = ["Faults", "HostConfig", "Pool", "serve_embedded", "write_token_file"]


def __getattr__(name: str):
    # Lazy, so a worker process (which imports envs.host.worker) never loads httpx or FastAPI.
    if name in ("serve_embedded", "write_token_file"):
        from envab.envs.host import embedded

        return getattr(embedded, name)
    if name == "Faults":
        from envab.envs.faults import Faults

        return Faults
    if name in ("HostConfig", "Pool"):
        from envab.envs.host import pool

        return getattr(pool, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
