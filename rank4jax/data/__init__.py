"""Data layer: readers, tokenizers, windows, grain pipelines and the built-in corpus.

It knows nothing of the model: it turns files into int32 windows (T+1, N) and batches of them.
"""
