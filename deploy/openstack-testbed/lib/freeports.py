"""Print N distinct free TCP ports on 127.0.0.1, space separated.

All sockets are held open until every port is chosen, so the N ports are
distinct; another process can still take one before the caller binds it.
"""
import socket
import sys

n = int(sys.argv[1])
socks = []
for _ in range(n):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
