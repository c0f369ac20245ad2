#if ZeroMQ
import Testing
import PortKitZeroMQ
@Test func zeroMQVersion() { #expect(pkzVersion() == 4) }
#endif
