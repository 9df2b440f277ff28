#!/usr/bin/env python
"""Play one big customer and several small ones against a running docshop.

The big customer uploads a folder of documents at once; a moment later the small ones
upload a few each. Everyone then asks for one preview. The script waits until every
document is converted and prints, per customer, when its first conversion started and
when its last one finished (seconds after the big upload began), and how long its
preview took.

    python load.py --url http://127.0.0.1:8000 --big 200 --small 5 --customers 4

Only the standard library: run it with any Python 3.9+.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from typing import Any

SMALL_NAMES = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"]
BIG = "big-corp"


class Shop:
    """The docshop JSON API."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if
                                     data is None else "POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def upload(self, customer: str, names: list[str]) -> list[int]:
        docs = [{"name": n, "content": f"{n}\n\nUploaded by {customer}."} for n in names]
        return list(self._call(f"/api/customers/{customer}/documents/",
                               {"documents": docs})["ids"])

    def preview(self, customer: str, doc_id: int) -> None:
        self._call(f"/api/customers/{customer}/documents/{doc_id}/preview/", {})

    def documents(self, customer: str) -> list[dict[str, Any]]:
        return list(self._call(f"/api/customers/{customer}/documents/")["documents"])


def play(shop: Shop, big: int, small: int, customers: int, batch: int = 50) -> float:
    """Upload everything and request the previews; returns the start time."""
    start = time.time()
    ids: list[int] = []
    for first in range(0, big, batch):
        names = [f"report-{i}.txt" for i in range(first, min(big, first + batch))]
        ids += shop.upload(BIG, names)
    shop.preview(BIG, ids[-1])  # big-corp wants to see its latest upload now

    def small_customer(name: str) -> None:
        got = [shop.upload(name, [f"{name}-{i}.txt"])[0] for i in range(small)]
        shop.preview(name, got[0])

    threads = [threading.Thread(target=small_customer, args=(name,))
               for name in SMALL_NAMES[:customers]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return start


def finished(docs: list[dict[str, Any]]) -> bool:
    return all(d["converted_at"] for d in docs) and all(
        d["preview_rendered_at"] for d in docs if d["preview_requested_at"])


def report(shop: Shop, start: float, names: list[str], timeout: float) -> list[dict[str, Any]]:
    """Wait until every customer's documents are converted; then describe each customer."""
    deadline = time.time() + timeout
    rows = []
    for name in names:
        # only this run's uploads (the database keeps earlier runs')
        while not finished(docs := [d for d in shop.documents(name)
                                    if d["uploaded_at"] >= start]):
            if time.time() > deadline:
                sys.exit(f"load.py: {name}'s documents were not all converted within "
                         f"{timeout:.0f}s (is a worker and `celery fair dispatch` running?)")
            time.sleep(0.2)
        previews = [d for d in docs if d["preview_requested_at"]]
        rows.append({
            "customer": name,
            "documents": len(docs),
            "first_start": min(d["conversion_started_at"] for d in docs) - start,
            "done": max(d["converted_at"] for d in docs) - start,
            "preview_wait": max((d["preview_rendered_at"] - d["preview_requested_at"]
                                 for d in previews), default=None),
            "preview_ran_as": [d["preview_ran_as"] for d in previews],
        })
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'customer':<10} {'docs':>5} {'first start':>12} {'all done':>9} "
          f"{'preview wait':>13}  preview ran as")
    for r in rows:
        wait = "-" if r["preview_wait"] is None else f"{r['preview_wait']:.2f}s"
        print(f"{r['customer']:<10} {r['documents']:>5} {r['first_start']:>11.2f}s "
              f"{r['done']:>8.2f}s {wait:>13}  {', '.join(r['preview_ran_as'])}")
    print("(seconds after big-corp began uploading)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--big", type=int, default=200, help="big-corp's documents")
    parser.add_argument("--small", type=int, default=5, help="documents per small customer")
    parser.add_argument("--customers", type=int, default=4, choices=range(1, 9),
                        metavar="1-8", help="how many small customers")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    shop = Shop(args.url)
    start = play(shop, args.big, args.small, args.customers)
    rows = report(shop, start, [BIG] + SMALL_NAMES[:args.customers], args.timeout)
    if args.json:
        print(json.dumps({"customers": rows}, indent=2))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
