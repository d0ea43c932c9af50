"""Everything reproci writes for people: the terminal tables, reports (Markdown, HTML with
charts, JSON) and the run history, GitHub annotations and step summaries, the
pull-request body of a golden update, and the webhook alert."""
