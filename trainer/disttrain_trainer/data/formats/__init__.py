"""One module per format of your own data, each with `read(spec, source, cache) -> Dataset`; the
table in data/loading.py picks one by spec.data.format and where the data lies."""
