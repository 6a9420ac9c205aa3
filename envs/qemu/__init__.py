"""The QEMU/KVM warm-snapshot arm: a pool of VMs restored from an internal snapshot over QMP."""
