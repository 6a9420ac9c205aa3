"""OSWorld's own task files as a task source: loaded and frozen byte for byte, judged runnable or
not on the X desktop's image (`source`; `python -m envab.envs.osworld`), and the files mirror
that lets a machine without network freeze them (`mirror`, `mirror_archive`).

It sits above the X desktop (envs/xdesktop), whose routes, getters and applications decide what
an image can run, and beside the host: the task factory (envs/tasks) stays below both."""
