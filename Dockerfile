# Aligner image: the library and its CLI on the CPU build of torch.
#     docker build -t aligner .
#     docker compose up --build
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
WORKDIR /app
# torch first, from PyTorch's CPU index: a bare `torch` from PyPI is a multi-GB CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY aligner ./aligner
COPY worker ./worker
COPY webapp ./webapp
COPY configs ./configs
COPY migrations ./migrations
COPY alembic.ini ./
# tracking: a job may log its metrics to TensorBoard and MLflow (logging.tensorboard / logging.mlflow).
RUN pip install --no-cache-dir -e '.[gguf,serve,service,tracking]' gunicorn
# The services run as this user, never root (docs/service.md "Docker Compose"): a fixed uid, so that the data volume
# keeps one owner across image rebuilds. /data is a new volume's mount point: Docker gives the volume its owner and
# mode (0700: other local users read no tenant's data). The code in /app stays root's and read-only to it.
RUN groupadd --gid 10001 aligner \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/aligner --shell /usr/sbin/nologin aligner \
    && mkdir -p /data && chown aligner:aligner /data && chmod 0700 /data
USER 10001:10001
ENTRYPOINT ["aligner"]
