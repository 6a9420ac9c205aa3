"""The QEMU/KVM warm-snapshot arm: a pool of VMs restored from an internal snapshot over QMP.

    from envs.qemu import QemuConfig, QemuPool
    with QemuPool(QemuConfig(vms=2)) as pool, pool.create(task) as session:
        ...

The guest is built (and cached) by `python -m envs.qemu.image`; see envs/qemu/image.py.
"""

from envs.qemu.image import GuestRecord, ImageConfig, ensure_guest
from envs.qemu.pool import QemuConfig, QemuPool, QemuSession

__all__ = ["GuestRecord", "ImageConfig", "QemuConfig", "QemuPool", "QemuSession", "ensure_guest"]
