"""Token files: the tokenizer, memmaps and samplers, data specs and mixtures, nanoGPT folders;
prepare/ writes them.
"""
