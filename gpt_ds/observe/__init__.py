"""What a person watches: metrics and logs, the metrics file, monitors, the start-up report
and its all-reduce rate, MFU peaks, plots, profiles, hangs.
"""
