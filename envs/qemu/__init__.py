"""The QEMU/KVM warm-snapshot arm: a pool of VMs restored from an internal snapshot over QMP.

    from envab.envs.qemu import QemuConfig, QemuPool
    with QemuPool(QemuConfig(vms=2)) as pool, pool.create(task) as session:
        ...

The guest is built (and cached) by `python -m envab.envs.qemu build`; see envs/qemu/image.py.
"""

__all__ = ["GuestRecord", "ImageConfig", "QemuConfig", "QemuPool", "QemuSession", "ensure_guest"]

_HOME = {
    "GuestRecord": "image",
    "ImageConfig": "image",
    "ensure_guest": "image",
    "QemuConfig": "pool",
    "QemuPool": "pool",
    "QemuSession": "pool",
}


def __getattr__(name: str):
    # Lazy, so `python -m envab.envs.qemu.image` runs without the package importing it first.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
