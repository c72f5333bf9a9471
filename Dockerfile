# The image docker-compose.yml builds for the worker, API and topic-init services.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY kron kron
COPY streams streams
COPY schemas schemas
COPY api api
COPY replay replay
RUN pip install --no-cache-dir .
ENTRYPOINT []
