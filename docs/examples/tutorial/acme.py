import time

from proj.tasks import convert

start = time.time()
doc = convert.delay("acme", 1).get(timeout=60)
print(f"acme's document {doc} is back after {time.time() - start:.2f}s")
