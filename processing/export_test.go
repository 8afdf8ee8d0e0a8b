package processing

// Accessors only tests use: they read the core's tables under their locks.

// count is the number of daemons running now.
func (r *daemonRegistry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.running)
}

// len is the number of objects the table holds now.
func (t *objectTable) len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.objects)
}
