"""A tiny inventory module: the example workspace squidcode's demo completes in."""

from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def total_value(items: list[Item]) -> float:
    """The value of everything in stock."""
    return sum(item.price * item.quantity for item in items)


def in_stock(items: list[Item]) -> list[Item]:
    """The items with at least one unit left."""
    return [item for item in items if item.quantity > 0]


def most_expensive(items: list[Item]) -> Item | None:
    """The item with the highest price, or None for an empty list."""
    if not items:
        return None
    return max(items, key=lambda item: item.price)


def average_price(items: list[Item]) -> float:
    """The mean price of the items, 0.0 for an empty list."""
    if not items:
        return 0.0
    
