"""Tables and figures as files: the helpers every stage that reports (report/, bench/) shares."""
