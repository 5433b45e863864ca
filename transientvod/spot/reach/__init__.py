"""Whether the head can reach a host over SSH the way horovodrun will: the launcher's check
before the job starts, and the gate that holds a booting server out of discovery until it can."""
