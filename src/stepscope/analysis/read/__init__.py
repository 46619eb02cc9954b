"""Reading traces: the streaming decoder, the columnar TraceTable, and loading one file, a folder of ranks or a run folder."""
