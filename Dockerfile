# The image docker-compose.yml builds for the worker, API and topic-init services.
# tests/unit/test_image.py copies what the COPY lines copy, installs it as the RUN line does
# and starts `kron` from it (bench/ and tests/ are not in the image; `kron bench` says so).
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
