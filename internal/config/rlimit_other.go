//go:build !unix

package config

func nofileLimit() uint64 { return 0 }
