# A heap of a real program's shape for bench/leak_scan/real_programs: with PYTHONMALLOC=malloc,
# millions of small objects (dict entries, lists, strings, tuples) and some larger buffers, all
# from malloc and kept alive through the interpreter's finalization, so they are live at exit.
import ctypes

table = {str(i): [i, str(i) * 3, (i, i + 1)] for i in range(400000)}
blobs = [bytes(600 + i % 2000) for i in range(60000)]
lists = [list(range(200)) for _ in range(3000)]
print(len(table), len(blobs), len(lists))
for keep in (table, blobs, lists):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(keep))
