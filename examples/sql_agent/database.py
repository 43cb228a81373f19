"""A small shop database (customers, products, orders), generated from a seed with the stdlib sqlite3.

The same seed gives the same rows byte for byte, so a task's gold result is reproducible
anywhere. The database is built once per seed and handed out as fresh in-memory copies, so
concurrent rollouts never share a connection and no agent query can change another's data.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
import sqlite3

SCHEMA = """\
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, age INTEGER);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, product_id INTEGER, quantity INTEGER, \
order_date TEXT);"""

FIRST_NAMES = [
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Goran",
    "Hana",
    "Ivan",
    "Jia",
    "Kofi",
    "Lea",
    "Mateo",
    "Nora",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tara",
]
CITIES = ["Lima", "Oslo", "Pune", "Quito", "Rome", "Seoul", "Tunis"]
CATEGORIES = {
    "books": ["Atlas", "Cookbook", "Novel", "Dictionary", "Poetry"],
    "garden": ["Rake", "Shovel", "Hose", "Seeds", "Planter"],
    "kitchen": ["Kettle", "Pan", "Knife", "Blender", "Mug"],
    "toys": ["Kite", "Puzzle", "Robot", "Yo-yo", "Blocks"],
}


@functools.lru_cache(maxsize=8)
def _image(seed: int, customers: int, orders: int) -> bytes:
    """The serialized database for ``seed`` (built once, copied per connection)."""
    rng = random.Random(seed)
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    names = rng.sample(FIRST_NAMES, min(customers, len(FIRST_NAMES)))
    conn.executemany(
        "INSERT INTO customers VALUES (?, ?, ?, ?)",
        [(i + 1, name, rng.choice(CITIES), rng.randint(18, 75)) for i, name in enumerate(names)],
    )
    products = []
    for category, items in CATEGORIES.items():
        for name in rng.sample(items, 4):
            products.append((len(products) + 1, name, category, round(rng.uniform(2, 90), 2)))
    conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", products)
    start = dt.date(2024, 1, 1)
    conn.executemany(
        "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
        [
            (
                i + 1,
                rng.randint(1, len(names)),
                rng.randint(1, len(products)),
                rng.randint(1, 5),
                (start + dt.timedelta(days=rng.randint(0, 365))).isoformat(),
            )
            for i in range(orders)
        ],
    )
    conn.commit()
    image = conn.serialize()
    conn.close()
    return image


def connect(seed: int = 0, *, customers: int = 16, orders: int = 60) -> sqlite3.Connection:
    """A private, read-only, in-memory copy of the database for ``seed``."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.deserialize(_image(seed, customers, orders))
    conn.execute("PRAGMA query_only = ON")
    return conn
