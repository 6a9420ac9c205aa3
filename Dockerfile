# The project's image for cluster jobs (profiles/kubernetes): the GPU lock, QEMU and gVisor's
# runsc as setup installs them, the project installed from this checkout.
#   docker build -t ghcr.io/env-ab/env-ab:gpu .
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1
RUN apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-dev git curl sudo \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /env-ab
COPY . .
RUN bash setup && .venv/bin/pip install -q -e '.[gpu]' -c locks/gpu.txt
ENV PATH=/env-ab/.venv/bin:$PATH
