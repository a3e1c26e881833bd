"""An IFRT Proxy server: jax's proxy client (``jax.extend.backend.ifrt_proxy``) runs its
programs on any ifrtpy :class:`~ifrtpy.Client` through it.

``serve(client)`` starts a gRPC server speaking the IFRT Proxy protocol (jaxlib 0.10 to
0.12 clients) over the client's public interfaces, by default on a unix socket only this
user can reach; each client's session is isolated from the others' in data and in time;
see docs/proxy.md. grpcio and protobuf (the ``ifrtpy[proxy]`` extra) are imported when a
server starts.

* :mod:`._protocol`: the message classes, read from the installed jaxlib's descriptors;
* :mod:`.wire`: IFRT serdes of dtypes, shardings, layouts and statuses;
* :mod:`.server`: :class:`ProxyServer` and :func:`serve`;
* :mod:`.service`: the gRPC service's RPC handlers (on the server's event loop);
* :mod:`.processor`: a session's in-order processor (its worker thread) and its end;
* :mod:`.session`: a session's handle tables and request dispatch;
* :mod:`.host_buffers`: a session's host buffers (storage, waiters, byte budgets);
* :mod:`.limits`: what clients may make the server hold, each limit's range;
* :mod:`.topology`, :mod:`.arrays`, :mod:`.executables`: the request handlers;
* :mod:`.local`: addresses, the private default socket and the shared directory for puts
  through files;
* :mod:`.fields`: the table of the fields the handlers use, checked against jaxlib's;
* :mod:`.jax_client`: :func:`connect_jax`, pointing jax at a server from code.
"""

from ifrtpy.proxy.jax_client import connect_jax as connect_jax
from ifrtpy.proxy.server import ProxyServer as ProxyServer
from ifrtpy.proxy.server import SessionInfo as SessionInfo
from ifrtpy.proxy.server import serve as serve
from ifrtpy.proxy.limits import Limits as Limits

__all__ = ["serve", "ProxyServer", "SessionInfo", "Limits", "connect_jax"]
