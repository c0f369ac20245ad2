// WireComponents holds one component inline and keeps its port and byte counts: every way of
// building and changing it must give the same components, counts and bytes as a plain array.

import Testing
@testable import PortKit

@Suite("Wire components")
struct WireComponentsTests {
    /// The counts and contents `components` must have to match `array`.
    private func expectMatches(_ components: WireComponents, _ array: [WireComponent],
                               sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(Array(components) == array, sourceLocation: sourceLocation)
        #expect(components.count == array.count, sourceLocation: sourceLocation)
        #expect(components.portCount == array.filter { $0 == .port }.count, sourceLocation: sourceLocation)
        let bytes = array.reduce(0) { total, component in
            if case .data(let data) = component { total + data.count } else { total }
        }
        #expect(components.dataByteCount == bytes, sourceLocation: sourceLocation)
        let viaBuffer = components.withUnsafeBufferPointer { Array($0) }
        #expect(viaBuffer == array, sourceLocation: sourceLocation)
    }

    @Test("appending one by one matches the array, through none, one and many")
    func appending() {
        let all: [WireComponent] = [.data([1, 2, 3]), .port, .data([]), .data([9]), .port]
        var components: WireComponents = []
        expectMatches(components, [])
        for count in 1...all.count {
            components.append(all[count - 1])
            expectMatches(components, Array(all[..<count]))
            #expect(components == WireComponents(Array(all[..<count])))
        }
    }

    @Test("replacing a component keeps the counts", arguments: [1, 3])
    func replacing(count: Int) {
        var array: [WireComponent] = Array(repeating: .data([7, 7]), count: count)
        var components = WireComponents(array)
        for index in 0..<count {
            components[index] = .port
            array[index] = .port
            expectMatches(components, array)
            components[index] = .data([1, 2, 3, 4, 5])
            array[index] = .data([1, 2, 3, 4, 5])
            expectMatches(components, array)
        }
    }

    @Test("the standard library's own mutations keep the counts")
    func standardMutations() {
        var array: [WireComponent] = [.data([1]), .port, .data([2, 3]), .data([])]
        var components = WireComponents(array)
        components.swapAt(0, 1)
        array.swapAt(0, 1)
        expectMatches(components, array)
        components.reverse()
        array.reverse()
        expectMatches(components, array)
        components[1...2] = WireComponents([.port, .data([9, 9, 9])])[...]
        array[1...2] = [.port, .data([9, 9, 9])]
        expectMatches(components, array)
    }

    @Test("a copy changed does not change the original")
    func valueSemantics() {
        let original: WireComponents = [.data([1]), .data([2])]
        var copy = original
        copy[0] = .port
        copy.append(.data([3]))
        expectMatches(original, [.data([1]), .data([2])])
        expectMatches(copy, [.port, .data([2]), .data([3])])
    }

    @Test("one component held inline encodes to the same bytes as one in an array")
    func inlineEncodesAsArray() {
        let component = WireComponent.data(Array("check-in".utf8))
        let inline = WireFrame(msgid: 100, hasReplyPort: true, components: WireComponents(component))
        let fromArray = WireFrame(msgid: 100, hasReplyPort: true, components: [component])
        var a: [UInt8] = []
        var b: [UInt8] = []
        WireEncoder.append(inline, to: &a)
        WireEncoder.append(fromArray, to: &b)
        #expect(a == b)
        #expect(a.count == WireEncoder.encodedSize(of: inline))
        #expect(inline == fromArray)
    }
}
