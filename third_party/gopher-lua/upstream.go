package lua

// UpstreamVersion is the gopher-lua release this copy was taken from (luaop patch:
// the copy lives inside luaop's module, so no build information names its version;
// README.md lists the changes).
const UpstreamVersion = "v1.1.2"
