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


@contextlib.contextmanager
def place(target, stop, on_wait=None):
    """The target with host, port and user from its place's NetworkService, while the place is
    reserved and acquired for it; released (and the reservation cancelled) on the way out,
    whatever ends the block. on_wait(text) is told, once, that it waits in labgrid's queue."""
    client, Reservation, ReservationState, pb2 = _client()
    spec = target.labgrid
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)        # grpc.aio binds its channel to this thread's current loop
    try:
        session = client.start_session(spec["coordinator"], loop=loop)
    except Exception as e:  # grpc's errors: the coordinator is not there
        loop.close()
        raise TransportError(f"labgrid coordinator {spec['coordinator']}: cannot connect: {e}") from None
    run = loop.run_until_complete
    token, acquired = None, None
    try:
        wanted = dict(spec.get("tags") or {})
        if spec.get("place"):
            wanted["name"] = spec["place"]
        filters = {"main": pb2.Reservation.Filter(filter=wanted)}
        res = Reservation.from_pb2(run(session.stub.CreateReservation(
            pb2.CreateReservationRequest(filters=filters, prio=0))).reservation)
        token, told = res.token, False
        while res.state is ReservationState.waiting:
            if stop.is_set():
                raise TransportError(f"labgrid: {stop.reason} while waiting for a place ({_what(spec)})")
            if on_wait and not told:
                on_wait(f"waiting in labgrid's queue for {_what(spec)} (reservation {token})")
                told = True
            time.sleep(POLL_S * 5)
            res = Reservation.from_pb2(run(session.stub.PollReservation(
                pb2.PollReservationRequest(token=token))).reservation)
        if res.state is not ReservationState.allocated:
            raise TransportError(f"labgrid: reservation {token} for {_what(spec)} ended {res.state.name}")
        name = res.allocations["main"][0]
        run(session.stub.AcquirePlace(pb2.AcquirePlaceRequest(placename=name)))
        acquired = name
        run(session.sync_with_coordinator())
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
                run(session.stub.ReleasePlace(pb2.ReleasePlaceRequest(placename=acquired)))
            if token:
                run(session.stub.CancelReservation(pb2.CancelReservationRequest(token=token)))
        with contextlib.suppress(Exception):
            run(session.stop())
        loop.close()


def _what(spec: dict) -> str:
    return f"place {spec['place']}" if spec.get("place") else \
        "a place tagged " + ", ".join(f"{k}={v}" for k, v in (spec.get("tags") or {}).items())
