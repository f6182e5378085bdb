"""What a person watches: metrics and logs, monitors, the start-up report, MFU peaks, plots, a
rank's resident memory (rss).
"""
