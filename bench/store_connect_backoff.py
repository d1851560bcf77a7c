#!/usr/bin/env python3
# Why init_comm waits for rank 0's store to listen (engine/comm/store_wait.h): a c10d TCPStore
# client begun before its server connects only after its connect backoff. Standalone; run with the
# venv's python: $DTRAIN_VENV/bin/python bench/store_connect_backoff.py

import threading, time, socket, datetime
from torch.distributed import TCPStore
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
for delay in (0.05, 0.1, 0.2, 0.3):
    port = free_port()
    srv = {}
    def serve():
        time.sleep(delay)
        srv["t"] = time.monotonic()
        srv["s"] = TCPStore("127.0.0.1", port, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    th = threading.Thread(target=serve); th.start()
    c = TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    t = time.monotonic()
    th.join()
    print("server up %.2f s after the client began; the client connected %.3f s after the server was up" % (delay, t - srv["t"]))
