"""``Inventory``: stock that never goes below zero, taken once per order, given back once.

The classic races: two buyers both read "1 left" and both take it; a retried request takes the
order's units twice; a refund webhook delivered twice restores the units twice. Each operation
is one script over the SKU's three keys (one hash tag): the stock, the order ledger, the buyers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django_redislua.recipes.base import (
    Op,
    arun,
    delete_op,
    identity,
    key,
    milliseconds,
    recipe_name,
    run,
    whole,
)
from django_redislua.replies import text


class Taken(NamedTuple):
    """What :meth:`Inventory.take` and :meth:`Inventory.give_back` did.

    ``ok``: the order holds its units (take) or they went back to the stock (give_back).
    ``reason``: take: ``"ok"`` (taken now), ``"duplicate_order"`` (this order id took before:
    ``ok`` is True while it holds its units, False once given back), ``"duplicate_user"``,
    ``"insufficient"``; give_back: ``"ok"``, ``"already_given_back"``, ``"unknown_order"``.
    ``left``: units left after the call.
    """

    ok: bool
    reason: str
    left: int


def _taken(reply: Any) -> Taken:
    return Taken(bool(reply[0]), text(reply[1]), int(reply[2]))


def _left(reply: Any) -> int:
    if isinstance(reply, list):
        raise LookupError("no stock is set for this SKU: set() it before add()")
    return int(reply)


_SET_MODES = {False: "set", True: "open"}  # set(if_absent=...) -> recipe_stock_set's mode


class Inventory:
    """The stock of every SKU of one sale (or shop) called ``name``.

    ``ttl`` (optional, a duration) is how long a SKU's keys live after each ``set``/``add``:
    the stock, its orders and its buyers expire together (the end of a flash sale). Without
    it they live until :meth:`clear`. The order ledger keeps one field per order (about 40
    bytes), so a SKU's memory grows with the orders it took, not with the requests.
    """

    kind = "stock"

    def __init__(self, name: str, ttl: float | str | None = None) -> None:
        self.name = recipe_name(name)
        self.ttl_ms = "" if ttl is None else milliseconds(ttl)

    def __repr__(self) -> str:
        return f"<Inventory {self.name}>"

    def keys(self, sku: str | bytes | int) -> list[str]:
        """The SKU's keys: stock ``{left, sold}``, orders ``{order id: "qty[ user]"}``, buyers
        ``{user id: how many of the user's orders hold units}``."""
        stock = key(self.kind, self.name, sku)
        return [stock, f"{stock}:orders", f"{stock}:buyers"]

    def _set(self, sku: str | bytes | int, units: int, mode: str) -> Op[int]:
        whole(units, "units", 1 if mode == "add" else 0)
        return Op("django_redislua.recipe_stock_set", self.keys(sku),
                  [mode, units, self.ttl_ms], _left)

    def set(self, sku: str | bytes | int, units: int, *, if_absent: bool = False) -> int:
        """Set the units left of ``sku`` (orders already taken stay recorded); returns the units
        left. With ``if_absent``, only when no stock is set: every server may open the sale at
        start-up, and a sale already selling is left as it is."""
        return run(self._set(sku, units, _SET_MODES[if_absent]))

    async def aset(self, sku: str | bytes | int, units: int, *, if_absent: bool = False) -> int:
        return await arun(self._set(sku, units, _SET_MODES[if_absent]))

    def add(self, sku: str | bytes | int, units: int) -> int:
        """Restock: add ``units`` (>= 1) to a SKU already :meth:`set`; returns the units left.
        Raises LookupError when the SKU has no stock set."""
        return run(self._set(sku, units, "add"))

    async def aadd(self, sku: str | bytes | int, units: int) -> int:
        return await arun(self._set(sku, units, "add"))

    def _take(self, sku: str | bytes | int, qty: int, order_id: str | bytes | int,
              user_id: str | bytes | int | None, one_per_user: bool) -> Op[Taken]:
        whole(qty, "qty", 1)
        if one_per_user and user_id is None:
            raise ValueError("one_per_user=True needs a user_id")
        user = "" if user_id is None else identity(user_id)
        return Op("django_redislua.recipe_stock_take", self.keys(sku),
                  [qty, identity(order_id), user, "1" if one_per_user else "0"], _taken)

    def take(self, sku: str | bytes | int, qty: int = 1, *, order_id: str | bytes | int,
             user_id: str | bytes | int | None = None, one_per_user: bool = False) -> Taken:
        """Take ``qty`` units for ``order_id``: all or nothing, never below zero. The same
        order id taken again takes nothing more (retry freely); with ``one_per_user``, a user
        with another order holding units (taken with ``one_per_user`` or not) is refused."""
        return run(self._take(sku, qty, order_id, user_id, one_per_user))

    async def atake(self, sku: str | bytes | int, qty: int = 1, *, order_id: str | bytes | int,
                    user_id: str | bytes | int | None = None,
                    one_per_user: bool = False) -> Taken:
        return await arun(self._take(sku, qty, order_id, user_id, one_per_user))

    def _give_back(self, sku: str | bytes | int, order_id: str | bytes | int) -> Op[Taken]:
        return Op("django_redislua.recipe_stock_give_back", self.keys(sku),
                  [identity(order_id)], _taken)

    def give_back(self, sku: str | bytes | int, order_id: str | bytes | int) -> Taken:
        """Return the units ``order_id`` took, exactly once (a refund delivered twice restores
        once), and free its user to order again. The order id cannot take again."""
        return run(self._give_back(sku, order_id))

    async def agive_back(self, sku: str | bytes | int, order_id: str | bytes | int) -> Taken:
        return await arun(self._give_back(sku, order_id))

    def _level(self, sku: str | bytes | int) -> Op[int | None]:
        return Op("django_redislua.recipe_stock_level", self.keys(sku)[:1], [],
                  lambda reply: None if reply is None else int(reply))

    def level(self, sku: str | bytes | int) -> int | None:
        """Units left of ``sku``, or None when no stock is set."""
        return run(self._level(sku))

    async def alevel(self, sku: str | bytes | int) -> int | None:
        return await arun(self._level(sku))

    def clear(self, sku: str | bytes | int) -> bool:
        """Delete the SKU: its stock, its orders and its buyers. True if it existed."""
        return run(delete_op(self.keys(sku)))

    async def aclear(self, sku: str | bytes | int) -> bool:
        return await arun(delete_op(self.keys(sku)))
