from proj.tasks import convert

for doc in range(2000):
    convert.delay("big-corp", doc)
print("big-corp queued 2000 documents")
