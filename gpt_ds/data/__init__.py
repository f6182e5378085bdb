"""Token files: the tokenizer, memmaps and training windows, data specs and mixtures, nanoGPT
folders; prepare/ writes them.
"""
