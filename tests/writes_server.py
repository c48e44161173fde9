"""A server subprocess for the crash test: FakeEncoder over INDEX, writes on, on 127.0.0.1:PORT.

Usage: python tests/writes_server.py INDEX PORT COMPACT_AFTER_CHANGES
"""

import sys

import uvicorn

from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder

if __name__ == "__main__":
    index, port, compact_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    settings = ServiceSettings(index=index, compact_after_changes=compact_after, max_wait_ms=1, log_json=False)
    app = create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
