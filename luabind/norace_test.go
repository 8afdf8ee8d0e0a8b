//go:build !race

package luabind

const raceDetector = false
