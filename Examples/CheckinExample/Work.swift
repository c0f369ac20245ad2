// The work the example hands out: count the words of a text, chunk by chunk, and hash each
// chunk (64-bit FNV-1a). Small, real, and easy to check against a single-threaded pass.

import Glibc

/// What counting one piece of text gives: its words, its bytes and its FNV-1a hash.
struct Tally: Equatable {
    var words: UInt64 = 0
    var bytes: UInt64 = 0
    var hash: UInt64 = Tally.fnvOffsetBasis

    static let fnvOffsetBasis: UInt64 = 0xcbf2_9ce4_8422_2325
    static let fnvPrime: UInt64 = 0x0000_0100_0000_01b3

    init(words: UInt64, bytes: UInt64, hash: UInt64) {
        self.words = words
        self.bytes = bytes
        self.hash = hash
    }

    /// Counts `text`: a word is a run of bytes that are not ASCII white space.
    init(counting text: ArraySlice<UInt8>) {
        var words: UInt64 = 0
        var hash = Self.fnvOffsetBasis
        var inWord = false
        text.withUnsafeBufferPointer { buffer in
            for byte in buffer {
                hash = (hash ^ UInt64(byte)) &* Self.fnvPrime
                let space = isWhiteSpace(byte)
                if !space && !inWord { words += 1 }
                inWord = !space
            }
        }
        self.init(words: words, bytes: UInt64(text.count), hash: hash)
    }
}

@inline(__always)
func isWhiteSpace(_ byte: UInt8) -> Bool {
    byte == 0x20 || (byte >= 0x09 && byte <= 0x0D)
}

/// The text to count: a file, or a built-in one so that a fresh clone runs with no argument.
enum Corpus {
    /// About 1 MiB of text made from the guide's vocabulary by a seeded generator: the same
    /// bytes (and so the same word count) on every run.
    static func builtIn(bytes target: Int = 1 << 20) -> [UInt8] {
        let vocabulary = """
            run loop port message thread worker main check in source input timer mode \
            observer event handler send receive reply wake sleep signal perform block \
            the a of to and is it that for on with as by from each its when while \
            cocoa foundation core mach socket name server delegate component data \
            default common custom distant future date invalidate notification queue
            """.split(separator: " ").map { Array($0.utf8) }
        var generator = SplitMix64(seed: 0x5054_4b49_5400_0001)
        var text: [UInt8] = []
        text.reserveCapacity(target + 128)
        while text.count < target {
            let wordsInLine = 6 + Int(generator.next() % 10)
            for index in 0..<wordsInLine {
                if index > 0 { text.append(0x20) }
                text.append(contentsOf: vocabulary[Int(generator.next() % UInt64(vocabulary.count))])
            }
            text.append(0x0A)
        }
        return text
    }

    /// The bytes of the file at `path`.
    static func read(path: String) throws(ExampleFailure) -> [UInt8] {
        guard let file = fopen(path, "rb") else {
            throw ExampleFailure("cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = fread(&buffer, 1, buffer.count, file)
            if count > 0 { bytes.append(contentsOf: buffer[0..<count]) }
            if count < buffer.count { break }
        }
        if ferror(file) != 0 {
            throw ExampleFailure("cannot read \(path): \(String(cString: strerror(errno)))")
        }
        return bytes
    }
}

/// The whole job: the text cut into chunks at white space (no word is split), counted
/// `rounds` times. Job `id` is chunk `id % chunks.count` of round `id / chunks.count`.
struct Job {
    let text: [UInt8]
    let chunks: [Range<Int>]
    let rounds: Int
    /// Each job's result and who counted it, once the reply arrived.
    private(set) var results: [(tally: Tally, worker: String)?]
    private var nextJob = 0
    private(set) var completed = 0

    /// At most this many jobs (chunks times rounds): each keeps its result until the end.
    static let maxJobs = 1 << 20

    /// - Throws: if the text makes more than `maxJobs` jobs.
    init(text: [UInt8], chunkSize: Int, rounds: Int) throws(ExampleFailure) {
        var chunks: [Range<Int>] = []
        var start = 0
        while start < text.count {
            var end = min(start + chunkSize, text.count)
            while end < text.count && !isWhiteSpace(text[end]) { end += 1 }
            chunks.append(start..<end)
            start = end
        }
        let (jobs, overflow) = chunks.count.multipliedReportingOverflow(by: rounds)
        guard !overflow, jobs <= Self.maxJobs else {
            throw ExampleFailure("too many jobs: \(chunks.count) chunks times \(rounds) rounds, at most \(Self.maxJobs); use a larger --chunk-size or fewer --rounds")
        }
        self.text = text
        self.chunks = chunks
        self.rounds = rounds
        self.results = Array(repeating: nil, count: jobs)
    }

    var count: Int { results.count }
    var isFinished: Bool { completed == count }

    /// The next job to hand out, if any is left.
    mutating func next() -> CountRequest? {
        guard nextJob < count else { return nil }
        defer { nextJob += 1 }
        let range = chunks[nextJob % chunks.count]
        return CountRequest(jobID: UInt32(nextJob), chunk: Array(text[range]))
    }

    /// Records a job's result; false if the job does not exist or was already answered.
    mutating func record(_ tally: Tally, forJob id: UInt32, by worker: String) -> Bool {
        let index = Int(id)
        guard index < count, results[index] == nil else { return false }
        results[index] = (tally, worker)
        completed += 1
        return true
    }

    /// Checks every result against a single-threaded pass over the same text, and returns the
    /// words and bytes of one round.
    func verify() throws(ExampleFailure) -> Tally {
        let whole = Tally(counting: text[...])
        for (index, range) in chunks.enumerated() {
            let expected = Tally(counting: text[range])
            for round in 0..<rounds {
                guard let (got, worker) = results[round * chunks.count + index] else {
                    throw ExampleFailure("verification failed: chunk \(index) of round \(round + 1) was never counted")
                }
                guard got == expected else {
                    throw ExampleFailure("verification failed: \(worker) counted chunk \(index) of round \(round + 1) as \(got.words) words, hash \(hex(got.hash)); a single-threaded pass says \(expected.words) words, hash \(hex(expected.hash))")
                }
            }
        }
        for round in 0..<rounds {
            let words = chunks.indices.reduce(UInt64(0)) { $0 + results[round * chunks.count + $1]!.tally.words }
            guard words == whole.words else {
                throw ExampleFailure("verification failed: round \(round + 1) counted \(words) words in all; a single-threaded pass says \(whole.words)")
            }
        }
        return whole
    }
}

/// A small seeded generator (SplitMix64), so the built-in text is the same everywhere.
struct SplitMix64 {
    private var state: UInt64
    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}

func hex(_ value: UInt64) -> String {
    let digits = String(value, radix: 16)
    return "0x" + String(repeating: "0", count: 16 - digits.count) + digits
}
