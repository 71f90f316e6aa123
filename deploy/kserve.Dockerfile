# packrat's KServe model server image: the engines in a kserve.ModelServer (the `kserve` extra), serving
# the packrat archives KServe mounts at /mnt/models over the Open Inference Protocol (REST 8080, gRPC 8081).
# No Java: TorchServe's front end is not run here (the torchserve package still installs: packrat's archive
# tools need it). Build from the repository root:
#   docker build -f deploy/kserve.Dockerfile -t packrat-kserve:latest .
#   docker build -f deploy/kserve.Dockerfile --build-arg EXTRAS=kserve,runtimes -t packrat-kserve:latest .
# Not built or run where packrat was developed (no docker there): see docs/kserve.md.
FROM python:3.11-slim-bookworm

# torch's CPU build first, from PyTorch's CPU index: `pip install .` then finds it installed and
# pulls no CUDA wheels.
ARG TORCH_SPEC=torch==2.13.0
RUN pip install --no-cache-dir "${TORCH_SPEC}" --index-url https://download.pytorch.org/whl/cpu

WORKDIR /opt/packrat
COPY pyproject.toml README.md ./
COPY packrat packrat
COPY handlers handlers
COPY ios_scheduler ios_scheduler
COPY loadtest loadtest
# EXTRAS: add `runtimes` (OpenVINO, ONNX Runtime) when the profiles served were measured with them.
ARG EXTRAS=kserve
RUN pip install --no-cache-dir ".[${EXTRAS}]"

# Non-root; uid 1000 is what the manifests of `packrat export k8s` run as. The server unpacks the
# archives under TMPDIR (the manifests point it at an emptyDir).
RUN useradd --create-home --uid 1000 --user-group packrat
USER 1000
WORKDIR /home/packrat

EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "packrat.frontends.kserve_server"]
CMD ["--model-store", "/mnt/models", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8081"]
