# The QEMU arm's guest: Debian bookworm with the embedded desktop, booted once and saved as the
# internal snapshot `warm`. The image is cached under the arm's `cache` folder (build/qemu by
# default, shared by experiments) by a digest of its inputs, so this job is a quick check unless
# the guest's sources changed; a fresh build takes a few minutes and needs root, debootstrap,
# qemu-system-x86 and qemu-utils. The record it writes (digests, acceleration, QEMU version) is
# what the run's receipts include.
from envs.qemu.image import source_files as qemu_guest_sources

QEMU_ARMS = sorted(a for a, spec in config["arms"].items() if spec["backend"] == "qemu")


def qemu_arm(wildcards):
    return {"cache": "build/qemu", "memory_mib": 256, "accel": "auto",
            **config["arms"][wildcards.arm]}


if QEMU_ARMS:

    rule qemu_guest:
        input:
            qemu_guest_sources(),
        output:
            f"{RESULTS}/{{arm}}/guest.json",
        wildcard_constraints:
            arm="|".join(QEMU_ARMS),
        params:
            cache=lambda w: qemu_arm(w)["cache"],
            memory=lambda w: qemu_arm(w)["memory_mib"],
            accel=lambda w: qemu_arm(w)["accel"],
        log:
            f"{LOGS}/{{arm}}/guest.log",
        shell:
            "{PYTHON} -m envs.qemu.image --cache {params.cache} --memory {params.memory}"
            " --accel {params.accel} --record {output} > {log} 2>&1"
