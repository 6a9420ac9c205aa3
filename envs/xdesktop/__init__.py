"""The real X desktop: a Debian root file system with an X server, a window manager and real
applications (`image`), the in-environment server that runs inside it (`server`, OSWorld's
routes), and the host's side of an OSWorld task's evaluation on it (`evaluate`)."""
