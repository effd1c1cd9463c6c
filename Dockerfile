# steadytune in a container: CUDA runtime, pinned torch, steadytune with its train, gpu and plot extras.
#   make image                      builds steadytune:<version> (docs/docker.md)
#   docker run --gpus all -v $PWD/runs:/runs -p 7860:7860 steadytune:0.1.0 run /work/config.yaml --dashboard
# Everything that varies is a build argument, so a machine that cannot reach a registry or the PyTorch index
# can build it from a local base image and a local wheel folder (docs/docker.md#offline).
ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

# torch is pinned and installed first, from the index of its CUDA build; the train extra pins the same version,
# so the later install keeps it instead of pulling another build from PyPI.
ARG TORCH_VERSION=2.13.0
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu126"
# Extra pip options for every install (a mirror: --index-url ...), and a CA bundle for a TLS-inspecting proxy
# (a path inside the build, e.g. mounted with podman build -v); pip reads PIP_CERT, its build subprocesses too.
ARG PIP_ARGS=""
ARG PIP_CERT=""
ARG EXTRAS=train,gpu,plot
ARG UID=1000

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false \
    VIRTUAL_ENV=/opt/steadytune \
    PATH=/opt/steadytune/bin:$PATH

# git: env.json records the commit of a mounted working tree. tini: signals reach the supervisor, which
# checkpoints on SIGTERM (docker stop) and reaps its worker.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates git tini \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/steadytune \
 && pip install ${PIP_ARGS} ${TORCH_PIP_ARGS} "torch==${TORCH_VERSION}"

COPY pyproject.toml README.md /opt/steadytune-src/
COPY src /opt/steadytune-src/src
RUN pip install ${PIP_ARGS} "/opt/steadytune-src[${EXTRAS}]" \
 && python -c "import torch, steadytune; print('torch', torch.__version__, 'steadytune', steadytune.__version__)"

# A non-root user owns the runs folder and the caches; mount the host's runs directory on /runs.
RUN useradd --create-home --uid "${UID}" --shell /usr/sbin/nologin steadytune \
 && mkdir -p /runs /work \
 && chown steadytune:steadytune /runs /work
USER steadytune
WORKDIR /work
ENV HF_HOME=/home/steadytune/.cache/huggingface \
    STEADYTUNE_DASHBOARD_PORT=7860

EXPOSE 7860
VOLUME ["/runs"]

# Healthy while the dashboard answers /healthz (no token needed): `steadytune dashboard` or `run --dashboard`.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('STEADYTUNE_DASHBOARD_PORT', '7860'), timeout=4)"

ENTRYPOINT ["tini", "--", "steadytune"]
CMD ["--help"]
