"""The Compose ``milvus`` profile on a Docker engine that reaches no image registry: stand-in images of
its Milvus and etcd, built from PyPI's and Debian's packages, and an override that names them.

- ``milvus``: PyPI's Milvus 2.3.5 standalone server (the profile names ``milvusdb/milvus:v2.5.10``),
  started by ``milvus run standalone`` as the profile's command says, with the etcd at ``ETCD_ENDPOINTS``
  (the profile's ``milvus-etcd``) and its data in ``/var/lib/milvus`` (the profile's volume).
- ``milvus-etcd``: Debian's etcd 3.4.23 (the profile names etcd 3.5.18), its flags and health check as in
  the profile.
- ``milvus-minio``: none. MinIO has no Debian or PyPI build, so the override leaves the service out and
  the stand-in server keeps its segments on its own volume (Milvus's local storage) instead of in MinIO.

Everything else of the profile runs as it is: the one-shot export from the built image, its order
(etcd healthy, Milvus healthy, export done, then the service) and the service reading the collection.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

MILVUS_IMAGE = "densehybrid-stacktest-milvus:2.3.5"
ETCD_IMAGE = "densehybrid-stacktest-etcd:3.4"

_LAUNCHER = '''#!/opt/milvus/bin/python
"""`milvus run standalone`: PyPI's Milvus 2.3.5 with the etcd at ETCD_ENDPOINTS and local storage."""
import os, re
import milvus

base = "/var/lib/milvus"
config = milvus.MilvusServerConfig(data_dir=base, proxy_port=19530)
config.resolve()
milvus._initialize_data_files(base)
path = os.path.join(base, "configs", "milvus.yaml")
text = open(path).read().replace("embed: true", "embed: false", 1)
text = re.sub(r"\\netcd:\\n  endpoints: \\S+", "\\netcd:\\n  endpoints: " + os.environ["ETCD_ENDPOINTS"], text, count=1)
open(path, "w").write(text)
binary = os.path.join(base, "bin", "milvus")
env = dict(os.environ, DEPLOY_MODE="STANDALONE", METRICS_PORT="9091", MILVUS_RUN_DIR=os.path.join(base, "run"),
           LD_LIBRARY_PATH=os.path.join(base, "bin"))
os.chdir(base)
os.execve(binary, [binary, "run", "standalone"], env)
'''

_MILVUS_DOCKERFILE = """FROM {base}
RUN python3 -m venv /opt/milvus && /opt/milvus/bin/pip install -q "milvus==2.3.5"
COPY milvus /usr/local/bin/milvus
RUN chmod 755 /usr/local/bin/milvus
EXPOSE 19530 9091
CMD ["milvus", "run", "standalone"]
"""

_ETCD_DOCKERFILE = """FROM {base}
RUN apt-get update -q && apt-get install -y -q --no-install-recommends etcd-server etcd-client \\
 && rm -rf /var/lib/apt/lists/*
EXPOSE 2379
CMD ["etcd"]
"""

OVERRIDE = f"""services:
  milvus-etcd:
    image: {ETCD_IMAGE}
  milvus:
    image: {MILVUS_IMAGE}
    depends_on: !override
      milvus-etcd:
        condition: service_healthy
  milvus-minio:
    profiles: [no-minio-build-here]
"""


def build_standins(docker: str, base: str, work: Path, env: dict) -> Path:
    """Build both images (from ``base``, engine.sh's Debian image) and write the override; returns its path."""
    for name, dockerfile, files in ((MILVUS_IMAGE, _MILVUS_DOCKERFILE, {"milvus": _LAUNCHER}),
                                    (ETCD_IMAGE, _ETCD_DOCKERFILE, {})):
        context = work / name.split(":")[0]
        context.mkdir(parents=True, exist_ok=True)
        (context / "Dockerfile").write_text(dockerfile.format(base=base))
        for file, text in files.items():
            (context / file).write_text(text)
        built = subprocess.run([docker, "build", "-q", "-t", name, str(context)], env=env, capture_output=True,
                               text=True, timeout=900)
        assert built.returncode == 0, f"building {name}: {built.stderr[-3000:]}"
    override = work / "docker-compose.milvus-standins.yml"
    override.write_text(OVERRIDE)
    return override
