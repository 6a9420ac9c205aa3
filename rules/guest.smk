# The QEMU arm's guest: Debian bookworm with the embedded desktop, booted once and saved as the
# internal snapshot `warm`. The image is cached under the arm's `cache` folder (build/qemu by
# default, shared by experiments) by a digest of its inputs, so this job is a quick check unless
# the guest's sources changed; a fresh build takes a few minutes and needs root, debootstrap,
# qemu-system-x86 and qemu-utils. The record it writes (digests, acceleration, QEMU version) is
# what the run's receipts include.
from envab.envs.qemu.image import source_files as qemu_guest_sources

if QEMU_ARMS:

    rule qemu_guest:
        input:
            [local(path) for path in qemu_guest_sources()],  # the image's own files
        output:
            f"{RESULTS}/{{arm}}/guest.json",
        wildcard_constraints:
            arm="|".join(QEMU_ARMS),
        params:
            # every default filled by load_config() in common.smk
            cache=lambda w: config["arms"][w.arm]["cache"],
            memory=lambda w: config["arms"][w.arm]["memory_mib"],
            accel=lambda w: config["arms"][w.arm]["accel"],
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/qemu_guest/{{arm}}.tsv",
        log:
            f"{LOGS}/{{arm}}/guest.log",
        shell:
            "python -m envab.envs.qemu.image --cache {params.cache} --memory {params.memory}"
            " --accel {params.accel} --record {output} --log {log}"
