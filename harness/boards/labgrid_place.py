"""A board from a labgrid place: reserved in labgrid's queue, locked (acquired) for the run's
jobs on it, reached over SSH at its NetworkService, and released however the run ends.

Labs that share boards between people and CI already run a labgrid coordinator and exporters;
a target that names a place (or tags) there gets its board the way `labgrid-client reserve
--wait` and `lock` do, through labgrid's client API (labgrid.remote.client), so zobench waits
behind the lab's other users instead of beside them. labgrid is optional (`zobench[labgrid]`)
and imported only here.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time

from harness.errors import UserError
from harness.boards.transport import POLL_S, TransportError

EXTRA = "pip install 'zobench[labgrid]' (labgrid's client API)"


def _client():
    try:
        from labgrid.remote import client
        from labgrid.remote.common import Reservation, ReservationState
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2
    except ImportError:
        raise UserError(f"a labgrid target needs labgrid: {EXTRA}") from None
    return client, Reservation, ReservationState, pb2


class _Sessions:
    """One labgrid session per coordinator in this process, kept on an event loop of its own
    thread while any board of the run uses it: gRPC shares one connection between a process's
    channels, and the coordinator takes one client stream per connection, so a pool's members,
    each reserving its own place, share the session (their calls go to its loop)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.open: dict[str, list] = {}     # address -> [session, loop, thread, users]

    @contextlib.contextmanager
    def of(self, address: str):
        """(session, run): run(f) awaits f() on the session's loop (a gRPC call is made there too:
        grpc.aio binds it to the loop current where it is made) and returns its value."""
        client, *_ = _client()
        with self.lock:
            if address not in self.open:
                self.open[address] = self._start(client, address)
            entry = self.open[address]
            entry[3] += 1
        session, loop = entry[0], entry[1]
        try:
            yield session, lambda f: asyncio.run_coroutine_threadsafe(_awaited(f), loop).result()
        finally:
            with self.lock:
                entry[3] -= 1
                if not entry[3]:
                    del self.open[address]
                    with contextlib.suppress(Exception):
                        asyncio.run_coroutine_threadsafe(_awaited(session.stop), loop).result(30)
                    loop.call_soon_threadsafe(loop.stop)
                    entry[2].join(30)
                    loop.close()

    @staticmethod
    def _start(client, address: str) -> list:
        from labgrid.util.proxy import proxymanager     # the default port, as labgrid-client reads an address

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"labgrid {address}", daemon=True)
        thread.start()

        async def start():      # made on its loop: grpc.aio binds a channel to the loop current where it is made
            session = client.ClientSession(proxymanager.get_grpc_address(address, default_port=20408), loop)
            await session.start()
            return session
        try:
            return [asyncio.run_coroutine_threadsafe(start(), loop).result(), loop, thread, 0]
        except Exception as e:  # grpc's errors: the coordinator is not there
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
            loop.close()
            raise TransportError(f"labgrid coordinator {address}: cannot connect: {e}") from None


SESSIONS = _Sessions()


async def _awaited(f):
    return await f()


@contextlib.contextmanager
def place(target, stop, on_wait=None):
    """The target with host, port and user from its place's NetworkService, while the place is
    reserved and acquired for it; released (and the reservation cancelled) on the way out,
    whatever ends the block. on_wait(text) is told, once, that it waits in labgrid's queue."""
    client, Reservation, ReservationState, pb2 = _client()
    spec = target.labgrid
    with SESSIONS.of(spec["coordinator"]) as (session, run):
        token, acquired = None, None
        try:
            wanted = dict(spec.get("tags") or {})
            if spec.get("place"):
                wanted["name"] = spec["place"]
            filters = {"main": pb2.Reservation.Filter(filter=wanted)}
            res = Reservation.from_pb2(run(lambda: session.stub.CreateReservation(
                pb2.CreateReservationRequest(filters=filters, prio=0))).reservation)
            token, told = res.token, False
            while res.state is ReservationState.waiting:
                if stop.is_set():
                    raise TransportError(f"labgrid: {stop.reason} while waiting for a place ({_what(spec)})")
                if on_wait and not told:
                    on_wait(f"waiting in labgrid's queue for {_what(spec)} (reservation {token})")
                    told = True
                time.sleep(POLL_S * 5)
                res = Reservation.from_pb2(run(lambda: session.stub.PollReservation(
                    pb2.PollReservationRequest(token=token))).reservation)
            if res.state is not ReservationState.allocated:
                raise TransportError(f"labgrid: reservation {token} for {_what(spec)} ended {res.state.name}")
            name = res.allocations["main"][0]
            run(lambda: session.stub.AcquirePlace(pb2.AcquirePlaceRequest(placename=name)))
            acquired = name
            run(session.sync_with_coordinator)
            service = [r for (_, cls), r in session.get_target_resources(session.get_place(name)).items()
                       if cls == "NetworkService"]
            if not service:
                raise TransportError(f"labgrid place {name} has no NetworkService to reach the board over SSH")
            params = service[0].params
            yield dataclasses.replace(target, host=params["address"], port=int(params.get("port") or 0),
                                      user=params.get("username") or target.user, labgrid={**spec, "acquired": name})
        except Exception as e:
            if type(e).__module__.startswith(("grpc", "labgrid")):     # the coordinator's refusals, in one line
                raise TransportError(f"labgrid ({_what(spec)}): {getattr(e, 'details', lambda: e)()}") from None
            raise
        finally:
            with contextlib.suppress(Exception):
                if acquired:
                    run(lambda: session.stub.ReleasePlace(pb2.ReleasePlaceRequest(placename=acquired)))
                if token:
                    run(lambda: session.stub.CancelReservation(pb2.CancelReservationRequest(token=token)))


def _what(spec: dict) -> str:
    return f"place {spec['place']}" if spec.get("place") else \
        "a place tagged " + ", ".join(f"{k}={v}" for k, v in (spec.get("tags") or {}).items())
