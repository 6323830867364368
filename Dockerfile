# Vigil: one image for every service (`vigil serve gateway|grader|model|dashboard`) and for the
# benchmark builder (`vigil benchmark build ...`). From the repository root:
#
#   docker build -t vigil:0.1.0 .
#
# torch is pinned to 2.13.0 (the `hf` extra). On Linux x86_64, PyPI's torch wheel is a CUDA
# build of several GB; for a CPU-only image, give pip PyTorch's CPU wheel index as an extra
# index (torch's CPU wheels are published there, not on PyPI):
#
#   docker build --build-arg PIP_EXTRA_INDEX_URL=<PyTorch CPU wheel index URL> -t vigil:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: a virtual environment with Vigil and its dependencies ----
FROM ${PYTHON_IMAGE} AS build
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    PATH=/opt/vigil/bin:${PATH}
RUN python -m venv /opt/vigil
WORKDIR /src
COPY . .
# Dependencies and grpcio-tools in one resolve, so that the protobuf runtime installed is one
# that the generated code accepts (a newer grpcio-tools alone would emit code for a protobuf
# newer than pyproject.toml allows, and the modules would refuse to import).
RUN pip install ".[hf]" "torch==2.13.0" "grpcio-tools>=1.68"
# Generate the protobuf/gRPC code as `make proto` does (generated files are in neither git nor
# the build context), then reinstall Vigil itself with it and drop the generator.
RUN python -m grpc_tools.protoc -I proto --python_out=proto --grpc_python_out=proto \
      --pyi_out=proto $(find proto/vigil -name '*.proto') \
 && find proto/vigil -type d -exec touch {}/__init__.py \; \
 && pip install --no-deps --force-reinstall . \
 && pip uninstall -y grpcio-tools

# ---- runtime ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vigil" \
      org.opencontainers.image.description="Continuous reliability audits of deployed medical-imaging vision-language models" \
      org.opencontainers.image.version="0.1.0"
ENV PATH=/opt/vigil/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/vigil \
    VIGIL_DATA_DIR=/var/lib/vigil
# A numeric, unprivileged user (uid/gid 10001, as the k8s manifests' runAsUser/fsGroup), so
# that Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 vigil \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/vigil --create-home \
      --shell /usr/sbin/nologin vigil \
 && install -d -o 10001 -g 10001 /var/lib/vigil /data/benchmarks
COPY --from=build /opt/vigil /opt/vigil
USER 10001:10001
WORKDIR /home/vigil
# gRPC: gateway 50051, grader 50052, model servers 50061. Metrics: 9101, 9102, 9111.
# Dashboard: 8501.
EXPOSE 50051 50052 50061 9101 9102 9111 8501
ENTRYPOINT ["vigil"]
CMD ["--help"]
