"""Small helpers every layer uses: errors, the process group, processes, the CLI style, flag files,
tool names, the launcher's rank variables.
"""
