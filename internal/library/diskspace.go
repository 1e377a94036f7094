package library

// CheckFreeSpace refuses new work while the data root is below its
// free-space floor (workspace.DataRoot.CheckFreeSpace).
func (o *Library) CheckFreeSpace() error {
	return o.data.CheckFreeSpace(o.opts.Limits.MinFreeBytes)
}
