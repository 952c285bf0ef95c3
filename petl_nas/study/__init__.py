"""What a study is made with and holds: its settings and study-wide records, read through a typed
header (`header.StudyHeader`). Every reader of a study goes through this folder."""
