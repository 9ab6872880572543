# strata-redis with every optional part, for `docker compose up` (see docker-compose.yml).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY strata_redis ./strata_redis
COPY lua ./lua
RUN pip install --no-cache-dir '.[s3,dashboard]'
ENTRYPOINT ["strata"]
CMD ["demo", "--redis-url", "redis://redis:6379/0"]
